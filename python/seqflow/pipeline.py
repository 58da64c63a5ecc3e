"""seqflow.Pipeline: a pipeline of the C library (sf_graph in push mode) driven from Python."""
import ctypes
import os
import tempfile
from collections import namedtuple

import numpy as np

from . import _lib as L

__all__ = ["Pipeline", "Result", "SeqflowError", "builtin_text", "DEFAULT_PIPELINE"]

DEFAULT_PIPELINE = "segment ! embed ! block ! norm"

Result = namedtuple("Result", "stream rows position segment provisional final")
Result.__doc__ = """One packet of hidden states that left the pipeline: rows [n, D] (float32, or the
uint16 bit patterns of bfloat16 after `norm dtype=bf16`) of `stream` starting at stream position
`position`; provisional rows came from a flush and will come again once the segment completes;
final marks the stream's last packet."""


class SeqflowError(RuntimeError):
    """A failed seqflow call: code (a negative sf_status), name (sf_strerror's text) and
    message (sf_last_error's one line naming the problem)."""

    def __init__(self, code, name, message):
        self.code, self.name, self.message = code, name, message
        super().__init__(f"{message} ({name})" if message else name)


def _check(rc, graph=None):
    if rc >= 0:
        return rc
    lib = L.lib()
    name = (lib.sf_strerror(rc) or b"").decode("utf-8", "replace")
    msg = (lib.sf_last_error() or b"").decode("utf-8", "replace")
    if not msg and graph:
        msg = (lib.sf_graph_error(graph) or b"").decode("utf-8", "replace")
    raise SeqflowError(rc, name, msg)


def builtin_text():
    """The built-in sample input of `seqflow run` as bytes (one token per byte)."""
    lib = L.lib()
    return ctypes.string_at(lib.sf_builtin_text(), lib.sf_builtin_text_length())


class _PacketRows:
    """Owns a pulled packet and exposes its rows to numpy without a copy: the packet is freed
    when the last array viewing it goes away."""

    def __init__(self, packet, dtype, ptr):
        self._packet = packet
        p = packet.contents
        typestr = "<u2" if dtype == L.SF_DTYPE_BF16 else "<f4"
        self.__array_interface__ = {"shape": (p.n, p.width), "typestr": typestr,
                                    "data": (ctypes.cast(ptr, ctypes.c_void_p).value, False), "version": 3}

    def __del__(self):
        if self._packet:
            L.lib().sf_packet_free(self._packet)
            self._packet = None


def _tokens_array(tokens):
    if isinstance(tokens, str):
        tokens = tokens.encode("utf-8")
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(tokens), dtype=np.uint8).astype(np.uint32)
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    a = np.asarray(tokens)
    if a.ndim != 1:
        raise ValueError(f"seqflow: tokens must be one-dimensional, not of shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dtype=np.uint32)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"seqflow: tokens must be integers, not {a.dtype}")
    if a.dtype != np.uint32:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > 0xFFFFFFFF:
            raise ValueError(f"seqflow: token {lo if lo < 0 else hi} is not a uint32 id")
    return np.ascontiguousarray(a, dtype=np.uint32)


class Pipeline:
    """A seqflow pipeline fed from Python (sf_graph push mode: the stages run in the calling
    thread, inside push/flush/end, with the GIL released).

        with seqflow.Pipeline("segment ! embed ! block ! norm", model="m.safetensors") as p:
            p.push(b"some text")       # any number of tokens, any number of times, any stream
            p.end()                    # the stream's partial last segment completes
            for stream, rows in p:     # rows: [n, D] float32 numpy arrays, in stream order
                ...

    model: a safetensors path, a seqflow.torch.SeqflowModel (exported to a temporary file), or
    None for the built-in model. Options: threads (CPU compute threads, 0: all cores),
    queue_depth, precision ("auto", "f32", "bf16", "fp8"), backend_settings ("k=v,..."),
    device_index. A Pipeline is not thread-safe: use it from one thread at a time.
    """

    _OPTIONS = ("threads", "queue_depth", "precision", "backend_settings", "device_index")

    def __init__(self, text=DEFAULT_PIPELINE, model=None, device="cpu", **options):
        self._graph = None
        self._model = None
        unknown = sorted(set(options) - set(self._OPTIONS))
        if unknown:
            raise TypeError(f"seqflow.Pipeline: unknown option {unknown[0]!r} (options: {', '.join(self._OPTIONS)})")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("seqflow.Pipeline: the pipeline text must be a non-empty string")
        precision = options.get("precision", "auto")
        if precision not in L.PRECISIONS:
            raise ValueError(f"seqflow.Pipeline: precision {precision!r}: one of {', '.join(L.PRECISIONS)}")
        lib = L.lib()
        self._lib = lib
        self._model = self._load_model(model)
        opts = L.sf_graph_options(device=device.encode(), device_index=int(options.get("device_index", 0)),
                                  queue_depth=int(options.get("queue_depth", 0)),
                                  threads=int(options.get("threads", 0)), precision=L.PRECISIONS[precision],
                                  backend_settings=(options.get("backend_settings") or "").encode())
        graph = ctypes.c_void_p()
        try:
            _check(lib.sf_graph_create(self._model, ctypes.byref(opts), ctypes.byref(graph)))
            self._graph = graph
            _check(lib.sf_graph_parse(graph, text.encode()), graph)
            # set up now (weights on the device, a GPU's warm-up): errors surface here, and the
            # first push pays only for its tokens
            _check(lib.sf_graph_prepare(graph), graph)
        except BaseException:
            self.close()
            raise
        self.text = text

    def _load_model(self, model):
        lib = self._lib
        out = ctypes.c_void_p()
        if model is None:
            cfg = ctypes.create_string_buffer(1024)  # larger than sf_model_config
            lib.sf_model_config_default(cfg)
            _check(lib.sf_model_create_random(cfg, L.SF_DEFAULT_SEED, ctypes.byref(out)))
            return out
        if hasattr(model, "save_pretrained"):
            with tempfile.TemporaryDirectory(prefix="seqflow-") as d:
                return self._load_model(model.save_pretrained(os.path.join(d, "model.safetensors")))
        path = os.fspath(model)
        _check(lib.sf_model_load(os.fsencode(path), ctypes.byref(out)))
        return out

    def _live(self):
        if self._graph is None:
            raise SeqflowError(-13, "closed", "seqflow.Pipeline: the pipeline is closed")
        return self._graph

    @staticmethod
    def _stream(stream):
        stream = int(stream)
        if not 0 <= stream < 2 ** 64:
            raise ValueError(f"seqflow: stream {stream} is not a uint64 id")
        return stream

    def push(self, tokens, stream=0):
        """Feeds tokens (bytes or str: one token per UTF-8 byte; or integer ids: a list, numpy
        array or torch tensor) to stream. Segments that complete are computed now."""
        g = self._live()
        a = _tokens_array(tokens)
        ptr = a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
        _check(self._lib.sf_graph_push(g, self._stream(stream), ptr, a.size), g)

    def flush(self, stream=0):
        """Emits the stream's pending partial segment provisionally (its state is not
        committed; the rows come again once the segment completes)."""
        g = self._live()
        _check(self._lib.sf_graph_flush(g, self._stream(stream)), g)

    def end(self, stream=0):
        """Ends the stream: its partial last segment is computed and committed."""
        g = self._live()
        _check(self._lib.sf_graph_end(g, self._stream(stream)), g)

    def pull(self):
        """The oldest packet that left the pipeline as a Result, or None when none waits. Its
        rows are a numpy view of the packet's memory (no copy), valid as long as they live."""
        g = self._live()
        while True:
            p = self._lib.sf_graph_pull(g)
            if not p:
                return None
            c = p.contents
            if c.kind != L.SF_PACKET_HIDDEN or c.width == 0:
                self._lib.sf_packet_free(p)  # not rows (a pipeline that stops before embed)
                raise SeqflowError(-2, "invalid argument",
                                   "seqflow.Pipeline: the pipeline's last stage sends no hidden rows "
                                   "(end it with block or norm)")
            ptr = c.x_bf16 if c.dtype == L.SF_DTYPE_BF16 else c.x
            info = (c.stream, c.position, c.segment, bool(c.flags & L.SF_PACKET_PROVISIONAL),
                    bool(c.flags & L.SF_PACKET_FINAL))
            if c.n == 0:
                self._lib.sf_packet_free(p)
                rows = np.zeros((0, c.width), dtype=np.float32)
            else:
                rows = np.asarray(_PacketRows(p, c.dtype, ptr))
            return Result(info[0], rows, *info[1:])

    def __iter__(self):
        """Yields (stream, rows) for every packet waiting now (rows: [n, D]), skipping empty ones."""
        while True:
            r = self.pull()
            if r is None:
                return
            if r.rows.shape[0]:
                yield r.stream, r.rows

    def run(self, tokens, stream=0):
        """Pushes tokens, ends the stream and returns its hidden states [T, D] in one array
        (the rows of other streams waiting are dropped)."""
        self.push(tokens, stream)
        self.end(stream)
        parts = [rows for s, rows in self if s == stream]
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.concatenate(parts)

    def close(self):
        """Frees the graph and the model; rows already taken stay valid. Idempotent."""
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if self._graph is not None:
            while True:  # packets never pulled
                p = lib.sf_graph_pull(self._graph)
                if not p:
                    break
                lib.sf_packet_free(p)
            lib.sf_graph_free(self._graph)
            self._graph = None
        if self._model is not None:
            lib.sf_model_free(self._model)
            self._model = None

    @property
    def closed(self):
        return self._graph is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
