"""seqflow.Client: a client of `seqflow serve` (docs/SERVE.md) over libzmq through ctypes.

A DEALER socket speaks the server's protocol: 32-byte headers, PUSH of uint32 token ids, ROWS
of wire packets (pipeline/wire.h) whose float32 rows become numpy arrays. Credit is granted one
reply at a time as replies are read; pushes wait (reading replies) while the stream's window is
full; PING goes out every second while the client waits, so that a slow server never takes it
for gone. libzmq is the system's libzmq.so.5; ctypes releases the GIL during every call.

Resume (protocol version 2): where the server keeps checkpoints (`seqflow serve --checkpoint`,
which says so with DURABLE right after OPENED), the client keeps each stream's tokens from the
server's durable position on. When its connection drops (a socket monitor reports it at once)
it reconnects on a fresh socket, backing off from 0.1 s to 2 s, for at most `resume_timeout`
seconds, sends RESUME with the rows it has, pushes its kept tokens again from the position the
server answers and drops rows it had already received: the application sees every committed
row once, as an uninterrupted run computes it.

A connection that drops while open() waits for OPENED (as examples/serve_client.c does): the
OPEN may or may not have reached the server, so the client sends RESUME of the stream on the
fresh socket; a server that took the OPEN and checkpoints hands the stream over (OPENED), one
that holds no state of it answers UNKNOWN and the client sends OPEN again. A server without
checkpoints that took the OPEN holds the stream for the old connection until its idle timeout:
open() then raises ServeError BUSY saying so.

Shared memory (protocol version 4): with shared_memory=True the client asks the server for a
region (MAP), maps it read-only and ATTACHes; the server then places most ROWS there and sends
a ROWS_AT saying where. The rows are copied out at once (the server reuses the space) and the
space is RELEASEd. A region belongs to one connection: after a drop the client maps a new one.
"""
import ctypes
import ctypes.util
import mmap
import os
import struct
import time
import warnings
from collections import deque, namedtuple

import numpy as np

from .pipeline import SeqflowError, _tokens_array

__all__ = ["Client", "Rows", "ServeError", "curve_keypair", "curve_public"]

OPEN, PUSH, FLUSH, CLOSE, CREDIT, PING, RESUME, MAP, ATTACH, RELEASE = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
OPENED, ROWS, CLOSED, ERROR, PONG, DURABLE, MAPPED, ROWS_AT = 16, 17, 18, 19, 20, 21, 22, 23
ERROR_NAMES = {0: "REFUSED", 1: "MALFORMED", 2: "TYPE", 3: "NOT_OPEN", 4: "BUSY", 5: "POSITION", 6: "WINDOW", 7: "LIMIT",
               8: "TOKEN", 9: "INTERNAL", 10: "UNKNOWN", 11: "GAP", 12: "REGION"}
_VERSION, _VERSION_REGION = 3, 4
_ROWS_AT = struct.Struct("<QQ")  # region position, length
_HEADER = struct.Struct("<4sBBHQQQ")  # magic, version, type, reserved, stream, a, b
_ENVELOPE = struct.Struct("<4sBBBBIIQQQQQII")  # pipeline/wire.h
_FRAME_HEADER = 96
_FINAL, _PROVISIONAL = 1, 2

# libzmq constants (zmq.h)
_ZMQ_DEALER, _ZMQ_LINGER, _ZMQ_POLLIN, _ZMQ_EAGAIN, _ZMQ_EINTR = 5, 17, 1, 11, 4
_ZMQ_CURVE_PUBLICKEY, _ZMQ_CURVE_SECRETKEY, _ZMQ_CURVE_SERVERKEY = 48, 49, 50
_ZMQ_DONTWAIT = 1
_ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, _ZMQ_EVENT_DISCONNECTED = 0x4000, 0x0200
_ZMQ_EVENT_HANDSHAKE_SUCCEEDED = 0x1000
_ZMQ_SNDTIMEO = 28
_ZMQ_PAIR = 0


class _zmq_msg(ctypes.Structure):
    _fields_ = [("_", ctypes.c_uint64 * 8)]  # zmq_msg_t: 64 opaque bytes


class _pollitem(ctypes.Structure):
    _fields_ = [("socket", ctypes.c_void_p), ("fd", ctypes.c_int), ("events", ctypes.c_short),
                ("revents", ctypes.c_short)]


_zmq = None


def _lib():
    global _zmq
    if _zmq is None:
        name = "libzmq.so.5"
        try:
            z = ctypes.CDLL(name)
        except OSError:
            found = ctypes.util.find_library("zmq")
            if not found:
                raise OSError("seqflow.Client needs libzmq (libzmq.so.5; Debian: libzmq5)")
            z = ctypes.CDLL(found)
        c_int, c_void_p, c_char_p, c_size_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        P = ctypes.POINTER
        for fn, res, args in [
            ("zmq_ctx_new", c_void_p, []), ("zmq_ctx_term", c_int, [c_void_p]),
            ("zmq_socket", c_void_p, [c_void_p, c_int]), ("zmq_close", c_int, [c_void_p]),
            ("zmq_setsockopt", c_int, [c_void_p, c_int, c_void_p, c_size_t]),
            ("zmq_connect", c_int, [c_void_p, c_char_p]),
            ("zmq_send", c_int, [c_void_p, c_void_p, c_size_t, c_int]),
            ("zmq_msg_init", c_int, [P(_zmq_msg)]), ("zmq_msg_close", c_int, [P(_zmq_msg)]),
            ("zmq_msg_recv", c_int, [P(_zmq_msg), c_void_p, c_int]),
            ("zmq_msg_data", c_void_p, [P(_zmq_msg)]), ("zmq_msg_size", c_size_t, [P(_zmq_msg)]),
            ("zmq_msg_more", c_int, [P(_zmq_msg)]),
            ("zmq_poll", c_int, [P(_pollitem), c_int, ctypes.c_long]),
            ("zmq_errno", c_int, []), ("zmq_strerror", c_char_p, [c_int]),
            ("zmq_has", c_int, [c_char_p]),
            ("zmq_curve_keypair", c_int, [c_char_p, c_char_p]),
            ("zmq_curve_public", c_int, [c_char_p, c_char_p]),
            ("zmq_socket_monitor", c_int, [c_void_p, c_char_p, c_int]),
        ]:
            f = getattr(z, fn)
            f.restype, f.argtypes = res, args
        _zmq = z
    return _zmq


def _zmq_error(what):
    z = _lib()
    return OSError(f"seqflow.Client: {what}: {z.zmq_strerror(z.zmq_errno()).decode()}")


def curve_keypair():
    """A new CURVE key pair (public, secret): 40-character Z85 strings (zmq_curve_keypair)."""
    z = _lib()
    pub, sec = ctypes.create_string_buffer(41), ctypes.create_string_buffer(41)
    if not z.zmq_has(b"curve") or z.zmq_curve_keypair(pub, sec) != 0:
        raise OSError("seqflow: this libzmq has no CURVE")
    return pub.value.decode(), sec.value.decode()


def curve_public(secret):
    """The public half (Z85) of a Z85 CURVE secret key: e.g. the server's, from its --key file."""
    secret = secret.strip()
    pub = ctypes.create_string_buffer(41)
    if len(secret) != 40 or _lib().zmq_curve_public(pub, secret.encode()) != 0:
        raise ValueError("seqflow: a CURVE secret key is 40 Z85 characters")
    return pub.value.decode()


class _Dropped(Exception):
    """The connection dropped again while the client was resuming (internal)."""


class ServeError(SeqflowError):
    """An ERROR from the server: code (1..12 of docs/SERVE.md), name ("TOKEN", ...), message (the
    server's text) and stream (the stream the refused message named; 0 when none). Code 0,
    name "REFUSED": the server refused this client's CURVE handshake."""

    def __init__(self, code, message, stream=0):
        self.stream = stream
        SeqflowError.__init__(self, code, ERROR_NAMES.get(code, f"ERROR {code}"), message)


class Rows(namedtuple("Rows", "stream position rows")):
    """One ROWS reply: `rows` [n, D] float32 (or the uint16 bit patterns of bfloat16 after
    `norm dtype=bf16`) of `stream` from stream position `position`. Unpacks as
    (stream, position, rows); `provisional` (a flush's rows: they come again once the segment
    completes) and `final` (the stream's last rows, after close) are attributes."""

    def __new__(cls, stream, position, rows, provisional=False, final=False):
        self = super().__new__(cls, stream, position, rows)
        self.provisional, self.final = provisional, final
        return self


class _Stream:
    __slots__ = ("pushed", "committed", "closing", "flushes", "broken", "total", "base", "kept", "resumable",
                 "resuming", "opening", "opened")

    def __init__(self, position):
        self.pushed = self.committed = self.total = self.base = position
        self.closing = False
        self.flushes = 0
        self.broken = None
        self.kept = bytearray()  # tokens [base, total) as little-endian uint32, for a resume
        self.resumable = None  # True: DURABLE came (the server checkpoints); False: ROWS came first
        self.resuming = False
        self.opening = False  # OPEN sent, OPENED not yet come: a dropped connection opens it again
        self.opened = 0  # OPENED replies taken


class Client:
    """A connection to `seqflow serve`. `Client(endpoint, server_key=None, client_keys=None)`
    connects at once (or later with connect()); without server_key the connection is plaintext
    (a server run with --plaintext). With CURVE, server_key is the server's public key (Z85) and
    client_keys this client's (public, secret) pair, or its secret alone, as listed in the
    server's --clients file. `credit` is the reply messages granted ahead per stream; `timeout`
    the seconds a wait may pass without a word from the server (then TimeoutError);
    `resume_timeout` the seconds a dropped connection is tried again before ConnectionError (0:
    never resumed). `shared_memory=True` (a server on this host) takes the rows through a
    shared-memory region of `shared_memory_bytes` (0: the server's default); connect() then waits
    for the server's answer, and where it has no region to give, or this process cannot open it,
    warns (RuntimeWarning) and takes the rows over the socket. Not thread-safe: one thread uses a
    Client at a time."""

    def __init__(self, endpoint=None, server_key=None, client_keys=None, credit=8, timeout=60.0, resume_timeout=30.0,
                 shared_memory=False, shared_memory_bytes=0):
        if not 1 <= int(credit) <= 256:
            raise ValueError("seqflow.Client: credit must be in 1..256")
        self._credit, self._timeout, self._resume_timeout = int(credit), timeout, float(resume_timeout)
        self._shm, self._shm_bytes = bool(shared_memory), int(shared_memory_bytes)
        self._version = _VERSION
        self._region = None  # the mmap of this connection's region, once ATTACHed
        self._mapping = self._remap = False  # a MAP unanswered; a MAP due (the connection dropped)
        self._generation = 0
        self._in_resume = self._handshaken = False
        self._ctx = self._sock = self._monitor = None
        self._streams = {}
        self._ready = deque()
        self._window = 0
        self._cookie = self._pong = 0
        self._refused = False
        if endpoint is not None:
            self.connect(endpoint, server_key, client_keys)

    # -- connection ----------------------------------------------------------------------------

    def connect(self, endpoint, server_key=None, client_keys=None):
        """Connects the socket (libzmq connects in the background and reconnects by itself)."""
        if self._sock:
            raise ValueError("seqflow.Client: already connected")
        z = _lib()
        if server_key is None and client_keys is not None:
            raise ValueError("seqflow.Client: client_keys need the server's public key (server_key)")
        if server_key is not None:
            if client_keys is None:
                raise ValueError("seqflow.Client: CURVE needs this client's keys (client_keys=(public, secret))")
            if isinstance(client_keys, str):
                client_keys = (curve_public(client_keys), client_keys)
            public, secret = (k.strip() for k in client_keys)
            if len(server_key.strip()) != 40 or len(public) != 40 or len(secret) != 40:
                raise ValueError("seqflow.Client: CURVE keys are 40 Z85 characters")
        self._ctx = z.zmq_ctx_new()
        self._endpoint = endpoint
        self._keys = None if server_key is None else (server_key.strip(), public, secret)
        self._open_socket()
        if self._shm:
            self._map()
        return self

    def _map(self, timeout=None):
        """Sends MAP and waits for its answer (the messages after it then go in the version it
        settles): MAPPED maps the region, a refusal leaves the rows on the socket. Returns
        _send's answer (False: a resume inside took over)."""
        self._unmap()
        self._remap, self._mapping, self._version = False, True, _VERSION_REGION
        if not self._send(MAP, 0, self._shm_bytes, timeout=timeout):
            return False
        while self._mapping:
            self._read()
        return True

    def _unmap(self):
        self._version = _VERSION
        if self._region is not None:
            self._region.close()
            self._region = None

    def _no_region(self, why):
        self._mapping = False
        self._unmap()
        warnings.warn(f"seqflow.Client: no shared memory, rows come over the socket: {why}", RuntimeWarning)

    def _open_socket(self):
        z = _lib()
        self._sock = z.zmq_socket(self._ctx, _ZMQ_DEALER)
        if not self._sock:
            self.disconnect()
            raise _zmq_error("zmq_socket")
        self._setopt(_ZMQ_LINGER, ctypes.c_int(0))
        if self._keys is not None:
            for opt, key in zip((_ZMQ_CURVE_SERVERKEY, _ZMQ_CURVE_PUBLICKEY, _ZMQ_CURVE_SECRETKEY), self._keys):
                self._setopt(opt, ctypes.create_string_buffer(key.encode(), 40))
        # a monitor reports a refused handshake, which otherwise looks like silence, and a dropped
        # connection (the server died or restarted), which the client resumes
        self._generation += 1
        addr = f"inproc://seqflow-client-monitor-{id(self)}-{self._generation}".encode()
        self._handshaken = False  # until the monitor reports the first handshake of this socket
        events = _ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | _ZMQ_EVENT_DISCONNECTED | _ZMQ_EVENT_HANDSHAKE_SUCCEEDED
        if z.zmq_socket_monitor(self._sock, addr, events) == 0:
            self._monitor = z.zmq_socket(self._ctx, _ZMQ_PAIR)
            z.zmq_connect(self._monitor, addr)
        if z.zmq_connect(self._sock, str(self._endpoint).encode()) != 0:
            err = _zmq_error(f"connect {self._endpoint}")
            self.disconnect()
            raise err

    def _close_socket(self):
        z = _lib()
        for attr in ("_monitor", "_sock"):
            s = getattr(self, attr)
            if s:
                z.zmq_close(s)
                setattr(self, attr, None)

    def _setopt(self, opt, value):
        if _lib().zmq_setsockopt(self._sock, opt, ctypes.byref(value), ctypes.sizeof(value)) != 0:
            raise _zmq_error("zmq_setsockopt")

    def disconnect(self):
        """Closes the socket (streams still open are ended by the server's idle timeout). Idempotent."""
        self._unmap()
        if self._sock or self._monitor:
            self._close_socket()
        if self._ctx:
            _lib().zmq_ctx_term(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.disconnect()

    def __del__(self):
        try:
            self.disconnect()
        except Exception:
            pass

    # -- requests ------------------------------------------------------------------------------

    def _send(self, type_, stream=0, a=0, b=0, payload=b"", timeout=None):
        if not self._sock:
            raise ValueError("seqflow.Client: not connected")
        # a region belongs to one connection: after a drop, the next message maps a new one first
        if self._remap and type_ not in (PING, MAP) and not self._map(timeout):
            return False
        z = _lib()
        msg = _HEADER.pack(b"SFS1", self._version, type_, 0, stream, a, b) + payload
        start = time.monotonic()
        timeout = self._timeout if timeout is None else timeout
        # without a peer (not yet connected, or its handshake refused) a DEALER cannot send:
        # wait for one, watching the monitor, within the client's timeout
        while z.zmq_send(self._sock, msg, len(msg), _ZMQ_DONTWAIT) < 0:
            if z.zmq_errno() not in (_ZMQ_EAGAIN, _ZMQ_EINTR):
                raise _zmq_error("send")
            if type_ == PING:
                return False  # a keep-alive is of no use where nothing is connected
            if self._check_monitor(100) and type_ != RESUME:
                return False  # the connection dropped and was resumed: what this carried was sent again
            if timeout is not None and time.monotonic() - start >= timeout:
                raise TimeoutError(f"seqflow.Client: could not send to {self._endpoint} for {timeout:g} s")
        return True

    def _check_monitor(self, wait_ms):
        """Raises ServeError if the monitor reported a refused handshake; resumes the streams
        (and returns True) if it reported a dropped connection; else sleeps wait_ms."""
        z = _lib()
        if not self._monitor:
            time.sleep(wait_ms / 1000)
            return False
        item = (_pollitem * 1)(_pollitem(self._monitor, 0, _ZMQ_POLLIN, 0))
        events = set()
        while z.zmq_poll(item, 1, wait_ms) > 0 and item[0].revents & _ZMQ_POLLIN:
            events.add(self._drain_monitor())
            wait_ms = 0
        if _ZMQ_EVENT_HANDSHAKE_FAILED_AUTH in events:
            raise ServeError(0, f"the server at {self._endpoint} refused this client's CURVE key "
                                "(not in its --clients file, or the wrong server key)")
        self._handshaken |= _ZMQ_EVENT_HANDSHAKE_SUCCEEDED in events
        if _ZMQ_EVENT_DISCONNECTED in events and self._shm:
            self._mapping, self._remap = False, True  # the server forgot the region with the connection
        # without a stream to resume, libzmq's own reconnection is all there is to do; an OPEN
        # not answered is one only where a handshake succeeded (else it never left this socket)
        if _ZMQ_EVENT_DISCONNECTED in events and any(self._handshaken or not st.opening
                                                     for st in self._streams.values()):
            if self._in_resume:
                raise _Dropped()  # dropped again while resuming: _resume starts over
            self._resume()
            return True
        return False

    def _resume(self):
        """The connection dropped: a fresh socket, RESUME of every stream the server checkpoints
        and of every stream whose OPENED had not come, their kept tokens pushed again. A stream
        it cannot resume gets ConnectionError (raised when it is used); the client's own streams
        are all lost only when the server stays away for resume_timeout seconds
        (ConnectionError). A drop while resuming starts it over, within the same time."""
        deadline = time.monotonic() + self._resume_timeout
        # a stream whose OPENED has not come: the server may hold it or not; RESUME tells
        streams = [(sid, st) for sid, st in self._streams.items() if st.resumable or st.opening]
        lost = [sid for sid, st in self._streams.items() if not (st.resumable or st.opening)]
        for sid in lost:
            self._streams.pop(sid)
        if self._resume_timeout <= 0 or not streams:
            self._close_socket()
            self._open_socket()
            lost += [sid for sid, _ in streams]
            for sid, _ in streams:
                self._streams.pop(sid)
            if lost:
                raise ConnectionError(f"seqflow.Client: the connection to {self._endpoint} dropped; streams {lost} "
                                      "are lost (the server keeps no checkpoints, or resume_timeout is 0)")
            return
        backoff = 0.1
        self._in_resume = True
        try:
            while True:
                try:
                    self._resume_once(streams, deadline, backoff)
                    break
                except _Dropped:
                    if time.monotonic() + backoff > deadline:
                        raise ConnectionError(f"seqflow.Client: the server at {self._endpoint} stayed away for "
                                              f"{self._resume_timeout:g} s") from None
                    time.sleep(backoff)
                    backoff = min(2.0, backoff * 2)
        finally:
            self._in_resume = False
        if lost:
            raise ConnectionError(f"seqflow.Client: the connection to {self._endpoint} dropped; streams {lost} are "
                                  "lost (opened where the server keeps no checkpoints); the others resumed")

    def _resume_once(self, streams, deadline, backoff):
        """One try of _resume on a fresh socket (_Dropped when that connection drops too)."""
        while True:
            self._close_socket()
            self._open_socket()
            try:  # a DEALER sends once it is connected: the first message (MAP or RESUME) tells
                if self._shm:  # a fresh connection, a fresh region
                    self._map(timeout=backoff)
                else:
                    sid, st = streams[0]
                    self._send(RESUME, sid, self._credit, st.committed, timeout=backoff)
                break
            except TimeoutError:
                if time.monotonic() + backoff > deadline:
                    raise ConnectionError(f"seqflow.Client: the server at {self._endpoint} stayed away for "
                                          f"{self._resume_timeout:g} s") from None
                backoff = min(2.0, backoff * 2)
        for sid, st in streams[0 if self._shm else 1:]:
            self._send(RESUME, sid, self._credit, st.committed)
        for sid, st in streams:
            st.resuming, st.flushes = True, 0  # a FLUSH not answered is dropped: its rows were provisional
        while any(st.resuming for _, st in streams):
            self._read()
        for sid, st in streams:
            self._repush(sid, st)  # nothing for a stream that was opening: it holds no tokens

    def _repush(self, stream, st):
        """Pushes the kept tokens from the position the server answered, within its window."""
        while st.pushed < st.total:
            while st.pushed - st.committed >= self._window and st.committed < st.pushed:
                self._read()
            room = max(1, min(self._window - max(0, st.pushed - st.committed), 1 << 16, st.total - st.pushed))
            at = (st.pushed - st.base) * 4
            self._send(PUSH, stream, st.pushed, room, bytes(st.kept[at:at + 4 * room]))
            st.pushed += room
        if st.closing:
            self._send(CLOSE, stream)

    def open(self, stream):
        """Opens `stream` (a uint64 id; the server's namespace is shared by all its clients) and
        returns its next position (0 for a new stream). Opening a stream this client has open
        again reports its position (after a refused PUSH, the one to push at next). A connection
        that drops before OPENED came is resumed like the other streams' (see the module's
        docstring): open() returns once the stream is open on the fresh connection, or raises."""
        stream = int(stream)
        if not 0 <= stream < 1 << 64:
            raise ValueError("seqflow.Client: a stream id is a uint64")
        st = self._streams.get(stream)
        if st is not None and not st.opening:
            opened = st.opened  # a re-open: its OPENED, or a resume's, tells the position
            self._send(OPEN, stream, 0)
            while st.opened == opened and self._streams.get(stream) is st:
                self._read()
            return st.pushed
        if st is None:
            st = self._streams[stream] = _Stream(0)
            st.opening = True
        try:
            self._send(OPEN, stream, self._credit)  # not sent when a resume inside took it over
            while st.opening:
                self._read()
        except BaseException:
            if self._streams.get(stream) is st and (st.opening or st.broken):
                self._streams.pop(stream)
            raise
        if st.broken:  # refused (on a fresh connection: BUSY, LIMIT, ...)
            self._streams.pop(stream, None)
            raise st.broken
        return st.pushed

    def push(self, stream, tokens):
        """Appends tokens (bytes or str: one token per UTF-8 byte; or integer ids) to an open
        stream. Returns at once unless the stream's window is full, when it reads replies (kept
        for recv() and iteration) until there is room. A refused PUSH (a token outside the
        vocabulary, ...) raises ServeError when its ERROR is read; call open(stream) then."""
        st = self._open_stream(stream)
        ids = _tokens_array(tokens)
        step = max(1, min(self._window, 1 << 16))
        for i in range(0, ids.size, step):
            chunk = ids[i:i + step]
            while st.pushed - st.committed + chunk.size > self._window and not st.broken:
                self._read()
            if st.broken:
                raise st.broken
            data = chunk.astype("<u4").tobytes()
            if st.resumable is not False:  # kept until the server says it is durable
                st.kept += data
            else:
                st.base = st.total + chunk.size
            st.total += chunk.size
            at = st.pushed
            st.pushed = st.total
            self._send(PUSH, stream, at, chunk.size, data)

    def flush(self, stream):
        """Asks for the rows of the stream's partial segment now (provisional rows)."""
        st = self._open_stream(stream)
        if self._send(FLUSH, stream):  # not when a resume swallowed it (its rows were provisional)
            st.flushes += 1

    def close(self, stream):
        """Ends the stream after the tokens pushed: its last rows (final) and CLOSED follow;
        iterating waits for them."""
        st = self._open_stream(stream)
        st.closing = True  # first: a resume inside the send sends CLOSE again
        self._send(CLOSE, stream)

    def _open_stream(self, stream):
        st = self._streams.get(int(stream))
        if st is None or st.closing:
            raise ValueError(f"seqflow.Client: stream {stream} is not open (open() it first)")
        return st

    def sync(self):
        """Waits until the server has handled every message sent before (a PING's PONG comes
        after them): an ERROR for any of them raises here. Replies read meanwhile are kept."""
        self._cookie += 1
        cookie = self._cookie
        self._send(PING, 0, cookie)
        while self._pong < cookie:
            self._read()

    # -- replies -------------------------------------------------------------------------------

    def pending(self):
        """True while a CLOSE or FLUSH this client sent is not yet answered."""
        return any(st.closing or st.flushes for st in self._streams.values())

    def recv(self, timeout=None):
        """The next ROWS reply as Rows(stream, position, rows) (with .provisional and .final), or
        None when none came within `timeout` seconds (None: wait as long as the server answers)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._read(left)
        return self._ready.popleft()

    def replies(self):
        """Yields every reply waiting now, then every reply while a CLOSE or FLUSH is unanswered."""
        while True:
            if self._ready:
                yield self._ready.popleft()
            elif self.pending():
                self._read()
            elif self._read(0) is None:
                return

    __iter__ = replies

    def run(self, stream, tokens):
        """Opens the stream, pushes the tokens, closes it and returns its committed rows as one
        [n, D] array (replies of other streams stay for recv() and iteration)."""
        self.open(stream)
        self.push(stream, tokens)
        self.close(stream)
        while stream in self._streams:
            self._read()
        parts, others = [], deque()
        for r in self._ready:
            if r.stream != stream:
                others.append(r)
            elif not r.provisional:
                parts.append(r.rows)
        self._ready = others
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def _read(self, timeout=None):
        """Waits up to `timeout` seconds (None: up to the client's timeout of silence) for one
        message and handles it: ROWS go to the ready queue (and one credit back), OPENED and
        CLOSED update the stream, ERROR raises. Returns (type, stream) or None."""
        z = _lib()
        start = time.monotonic()
        last_ping = start
        while True:
            items = (_pollitem * 2)(_pollitem(self._sock, 0, _ZMQ_POLLIN, 0))
            n = 1
            if self._monitor:
                items[1] = _pollitem(self._monitor, 0, _ZMQ_POLLIN, 0)
                n = 2
            now = time.monotonic()
            wait = 1.0 if timeout is None else min(1.0, max(0.0, start + timeout - now))
            rc = z.zmq_poll(items, n, int(wait * 1000))
            if rc < 0 and z.zmq_errno() != _ZMQ_EINTR:
                raise _zmq_error("poll")
            if n == 2 and items[1].revents & _ZMQ_POLLIN and self._check_monitor(0):
                continue  # resumed on a fresh socket
            if rc > 0 and items[0].revents & _ZMQ_POLLIN:
                return self._handle(self._recv_bytes())
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                return None
            if self._timeout is not None and now - start >= self._timeout:
                raise TimeoutError(f"seqflow.Client: no answer from {self._endpoint} for {self._timeout:g} s")
            if now - last_ping >= 1.0:  # keeps this client alive on the server while it waits
                self._cookie += 1
                self._send(PING, 0, self._cookie)
                last_ping = now

    def _drain_monitor(self):
        """Reads one monitor event (two frames: u16 event, u32 value; the endpoint) and returns
        its event number."""
        z = _lib()
        event = 0
        for i in range(2):
            msg = _zmq_msg()
            z.zmq_msg_init(ctypes.byref(msg))
            if z.zmq_msg_recv(ctypes.byref(msg), self._monitor, _ZMQ_DONTWAIT) >= 2 and i == 0:
                event = struct.unpack_from("<H", ctypes.string_at(z.zmq_msg_data(ctypes.byref(msg)), 2))[0]
            z.zmq_msg_close(ctypes.byref(msg))
        return event

    def _recv_bytes(self):
        """One whole message: every frame of it (in protocol 3 a ROWS may come in several),
        copied once into a writable bytearray (so that the rows' arrays are writable too)."""
        z = _lib()
        frames = []
        try:
            more = True
            while more:
                msg = _zmq_msg()
                z.zmq_msg_init(ctypes.byref(msg))
                frames.append(msg)
                if z.zmq_msg_recv(ctypes.byref(msg), self._sock, 0) < 0:
                    raise _zmq_error("recv")
                more = bool(z.zmq_msg_more(ctypes.byref(msg)))
            data = bytearray(sum(z.zmq_msg_size(ctypes.byref(m)) for m in frames))
            at = 0
            for m in frames:
                size = z.zmq_msg_size(ctypes.byref(m))
                if size:
                    ctypes.memmove((ctypes.c_char * size).from_buffer(data, at), z.zmq_msg_data(ctypes.byref(m)), size)
                at += size
            return data
        finally:
            for m in frames:
                z.zmq_msg_close(ctypes.byref(m))

    def _handle(self, data):
        if len(data) < _HEADER.size:
            raise SeqflowError(-1, "FRAME", "seqflow.Client: a reply shorter than a header")
        magic, version, type_, _, stream, a, b = _HEADER.unpack_from(data)
        if magic != b"SFS1" or version not in (1, 2, 3, 4):
            raise SeqflowError(-1, "FRAME", "seqflow.Client: a reply that is not of protocol SFS1 version 1 to 4")
        st = self._streams.get(stream)
        if type_ == OPENED:
            self._window = b
            if st is None:
                st = self._streams[stream] = _Stream(a)
            elif st.opening:
                if st.resuming and a != 0:  # this client pushed nothing to it: another client's
                    st.broken = SeqflowError(-1, "STATE", f"seqflow.Client: stream {stream} resumed at position {a} "
                                                          "after the connection dropped before OPENED: another "
                                                          "client's stream of the same id")
                else:
                    st.pushed = st.committed = st.total = st.base = a
                st.opening = st.resuming = False
            elif st.resuming:  # the position to push the kept tokens from
                if not st.base <= a <= st.total:
                    raise SeqflowError(-1, "STATE", f"seqflow.Client: the server resumes stream {stream} at {a}; "
                                                    f"this client holds tokens {st.base}..{st.total}")
                st.pushed, st.resuming = a, False
            else:  # a re-open: the position to push at next (rows still on their way count later)
                st.pushed, st.broken = a, None
                st.total = max(st.total, a)
            st.opened += 1
        elif type_ == DURABLE:
            if st is not None:
                st.resumable = True
                if st.base < a <= st.total:  # the server's checkpoint holds them
                    del st.kept[:(a - st.base) * 4]
                    st.base = a
        elif type_ in (ROWS, ROWS_AT):
            if type_ == ROWS:
                r = self._rows(stream, a, b, memoryview(data)[_HEADER.size:])
            else:
                r = self._rows(stream, a, b, self._from_region(data))
            keep = True
            if st is not None:
                if st.resumable is None:  # rows before any DURABLE: the server keeps no checkpoints
                    st.resumable = False
                    st.kept, st.base = bytearray(), st.total
                if r.provisional:
                    st.flushes = max(0, st.flushes - 1)
                elif a + b <= st.committed and b:  # sent again after a resume: had them
                    keep = False
                else:
                    if a < st.committed:  # partly had them
                        r = Rows(stream, st.committed, r.rows[st.committed - a:], r.provisional, r.final)
                    st.committed = max(st.committed, a + b)
            self._send(CREDIT, stream, 1, st.committed if st is not None else 0)
            if keep:
                self._ready.append(r)
        elif type_ == MAPPED:
            if self._mapping:  # else the answer to a MAP of a connection that dropped since
                self._attach(a, bytes(data[_HEADER.size:_HEADER.size + b]))
        elif type_ == PONG:
            self._pong = max(self._pong, a)
        elif type_ == CLOSED:
            self._streams.pop(stream, None)
        elif type_ == ERROR:
            text = bytes(data[_HEADER.size:_HEADER.size + b]).decode("utf-8", "replace")
            if self._mapping and stream == 0 and a in (1, 12):  # MAP refused (1: a server before version 4)
                self._no_region(f"the server answered MAP with {ERROR_NAMES[a]}: {text}")
                return type_, stream
            if st is not None and st.resuming and a == 10 and st.base == 0:
                # not checkpointed yet when the server stopped: open it afresh, push from 0
                self._send(OPEN, stream, self._credit)
                return type_, stream
            if st is not None and st.opening:
                if st.resuming and a == 4:  # the OPEN reached the server before the connection dropped
                    text += (" (the connection dropped before OPENED: the server holds the stream for the "
                             "dropped connection until its --idle-timeout; open it again after that)")
                st.opening = st.resuming = False
                st.broken = ServeError(int(a), text, stream)  # open() raises it (a resume goes on)
                return type_, stream
            err = ServeError(int(a), text, stream)
            if st is not None and a in (5, 6, 8):  # a refused PUSH: the stream's position is unknown
                st.broken = err
            if st is not None and a == 3:  # the server no longer holds it (expired)
                self._streams.pop(stream, None)
            raise err
        return type_, stream

    def _attach(self, size, name):
        """Maps the region MAPPED named and ATTACHes; where that fails (another host, another
        user) sends nothing, and the server goes on sending over the socket."""
        self._mapping = False
        try:
            name = name.decode()
            if not name.startswith("/") or "/" in name[1:]:
                raise ValueError(f"not a shared-memory name: {name!r}")
            fd = os.open("/dev/shm" + name, os.O_RDONLY | os.O_CLOEXEC)
            try:  # ACCESS_READ: PROT_READ, MAP_SHARED, and Python knows the buffer is read-only
                self._region = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        except (OSError, ValueError) as e:
            self._no_region(f"cannot map the server's region: {e}")
            return
        self._send(ATTACH, 0, size)

    def _from_region(self, data):
        """A ROWS_AT's packet, copied out of the region (the server reuses the space), which is
        RELEASEd at once."""
        if len(data) != _HEADER.size + _ROWS_AT.size or self._region is None:
            raise SeqflowError(-1, "FRAME", "seqflow.Client: a ROWS_AT without a region or of the wrong size")
        pos, n = _ROWS_AT.unpack_from(data, _HEADER.size)
        at = pos % len(self._region)
        if at + n > len(self._region):
            raise SeqflowError(-1, "FRAME", "seqflow.Client: a ROWS_AT beyond the region's end")
        with memoryview(self._region) as view:
            packet = bytearray(view[at:at + n])
        self._send(RELEASE, 0, pos + n)
        return packet

    @staticmethod
    def _rows(stream, position, n, packet):
        if len(packet) < _ENVELOPE.size:
            raise SeqflowError(-1, "FRAME", "seqflow.Client: a ROWS reply without its packet")
        (magic, _, _, dtype, _, flags, _, _, _, _, pn, width, _, _) = _ENVELOPE.unpack_from(packet)
        provisional, final = bool(flags & _PROVISIONAL), bool(flags & _FINAL)
        if magic != b"SFW1" or pn != n:
            raise SeqflowError(-1, "FRAME", "seqflow.Client: a ROWS packet that does not match its header")
        if n == 0:
            return Rows(stream, position, np.zeros((0, width), np.float32), provisional, final)
        f = memoryview(packet)[_ENVELOPE.size:]
        if len(f) < _FRAME_HEADER or bytes(f[:4]) != b"SQF1" or f[9] != 0 or f[10] != 0:
            raise SeqflowError(-1, "FRAME", "seqflow.Client: ROWS rows are not a raw, lossless HIDDEN frame")
        payload = struct.unpack_from("<Q", f, 72)[0]
        typestr = "<u2" if dtype == 1 else "<f4"
        if payload != n * width * (2 if dtype == 1 else 4) or len(f) - _FRAME_HEADER != payload:
            raise SeqflowError(-1, "FRAME", "seqflow.Client: ROWS payload of the wrong size")
        rows = np.frombuffer(f, dtype=typestr, offset=_FRAME_HEADER).reshape(n, width)
        return Rows(stream, position, rows, provisional, final)
