"""ctypes declarations of the public C API (include/seqflow/*.h) that the bindings use, and the
search for libseqflow.so.

The library is looked for, in this order, at:
  1. $SEQFLOW_LIB (a path to libseqflow.so or to the folder holding it);
  2. the build tree this package was installed from (recorded at install time in _paths.py);
  3. the libdir of `pkg-config seqflow` (an installed seqflow);
  4. the dynamic loader's search path (libseqflow.so.0).
ctypes.CDLL releases the GIL for the duration of every foreign call.
"""
import ctypes
import os
import shutil
import subprocess

_lib = None


class sf_graph_options(ctypes.Structure):
    _fields_ = [("device", ctypes.c_char_p), ("device_index", ctypes.c_int),
                ("queue_depth", ctypes.c_int), ("threads", ctypes.c_int),
                ("precision", ctypes.c_int), ("backend_settings", ctypes.c_char_p)]


class sf_packet(ctypes.Structure):
    """The leading fields of sf_packet (packet.h), up to the rows; the rest is never read here."""
    _fields_ = [("kind", ctypes.c_int), ("flags", ctypes.c_uint32), ("stream", ctypes.c_uint64),
                ("segment", ctypes.c_uint64), ("position", ctypes.c_uint64), ("n", ctypes.c_size_t),
                ("width", ctypes.c_size_t), ("tokens", ctypes.POINTER(ctypes.c_uint32)),
                ("dtype", ctypes.c_int), ("x", ctypes.POINTER(ctypes.c_float)),
                ("x_bf16", ctypes.POINTER(ctypes.c_uint16))]


SF_PACKET_HIDDEN = 3
SF_PACKET_FINAL = 1 << 0
SF_PACKET_PROVISIONAL = 1 << 1
SF_DTYPE_F32, SF_DTYPE_BF16 = 0, 1
SF_DEFAULT_SEED = 0x5EC0F1017
PRECISIONS = {"auto": 0, "f32": 1, "bf16": 2, "fp8": 3}


def _candidates():
    env = os.environ.get("SEQFLOW_LIB")
    if env:
        yield os.path.join(env, "libseqflow.so") if os.path.isdir(env) else env
        return  # an explicit choice is not second-guessed
    try:
        from . import _paths
        for d in _paths.BUILD_DIRS:
            yield os.path.join(d, "libseqflow.so")
    except ImportError:
        pass
    # the build tree of a source checkout (running from python/ without installing)
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "libseqflow.so")
    if shutil.which("pkg-config"):
        try:
            libdir = subprocess.run(["pkg-config", "--variable=libdir", "seqflow"], capture_output=True,
                                    text=True, timeout=10).stdout.strip()
            if libdir:
                yield os.path.join(libdir, "libseqflow.so.0")
        except (OSError, subprocess.SubprocessError):
            pass
    yield "libseqflow.so.0"


def _declare(lib):
    c_int, c_size_t, c_uint64, c_char_p, c_void_p = (ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64,
                                                     ctypes.c_char_p, ctypes.c_void_p)
    P = ctypes.POINTER
    sigs = {
        "sf_strerror": (c_char_p, [c_int]),
        "sf_last_error": (c_char_p, []),
        "sf_clear_error": (None, []),
        "sf_model_load": (c_int, [c_char_p, P(c_void_p)]),
        "sf_model_config_default": (None, [c_void_p]),
        "sf_model_create_random": (c_int, [c_void_p, c_uint64, P(c_void_p)]),
        "sf_model_free": (None, [c_void_p]),
        "sf_builtin_text": (c_void_p, []),
        "sf_builtin_text_length": (c_size_t, []),
        "sf_graph_create": (c_int, [c_void_p, P(sf_graph_options), P(c_void_p)]),
        "sf_graph_free": (None, [c_void_p]),
        "sf_graph_parse": (c_int, [c_void_p, c_char_p]),
        "sf_graph_prepare": (c_int, [c_void_p]),
        "sf_graph_error": (c_char_p, [c_void_p]),
        "sf_graph_push": (c_int, [c_void_p, c_uint64, P(ctypes.c_uint32), c_size_t]),
        "sf_graph_flush": (c_int, [c_void_p, c_uint64]),
        "sf_graph_end": (c_int, [c_void_p, c_uint64]),
        "sf_graph_pull": (P(sf_packet), [c_void_p]),
        "sf_packet_free": (None, [P(sf_packet)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def lib():
    """The loaded libseqflow (loaded on first use). OSError naming every place tried."""
    global _lib
    if _lib is None:
        tried = []
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(path + " (missing)")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(handle)
            _lib = handle
            break
        else:
            raise OSError("seqflow: libseqflow.so not found; set SEQFLOW_LIB to its path. Tried: " + "; ".join(tried))
    return _lib


def library_path():
    """The file the library was loaded from."""
    return lib()._name
