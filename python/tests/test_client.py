"""seqflow.Client against a real `seqflow serve` (plaintext on an ipc endpoint, and CURVE): its
rows equal `seqflow run`'s and seqflow.Pipeline's for the same tokens, byte for byte."""
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest

import seqflow

MODEL = ["--layers", "1", "-t", "1"]


@pytest.fixture
def serve(binary):
    """A factory: serve(*args) starts `seqflow serve` on a fresh ipc endpoint and returns it;
    every server started is stopped (SIGTERM, exit 0 expected) at the end of the test."""
    started = []
    folder = tempfile.mkdtemp(prefix="sfs")  # short: an ipc path is at most 107 bytes

    def start(*args, plaintext=True):
        endpoint = f"ipc://{folder}/s{len(started)}"
        cmd = [binary, "serve", "--bind", endpoint, "-q"] + (["--plaintext"] if plaintext else []) + list(args)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(proc)
        path = endpoint[len("ipc://"):]
        for _ in range(200):
            if os.path.exists(path) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1].decode()
        return endpoint

    yield start
    for proc in started:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
    shutil.rmtree(folder, ignore_errors=True)


def run_rows(binary, tokens, model=MODEL):
    """`seqflow run`'s rows for one stream of byte tokens, as raw float32 bytes."""
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "in"), os.path.join(d, "out")
        with open(src, "wb") as f:
            f.write(tokens)
        subprocess.run([binary, "run", "-q", "-i", src, "-o", out] + model, check=True)
        with open(out, "rb") as f:
            return f.read()


def texts():
    text = seqflow.builtin_text()
    return [text, text[100:1100], b"short", text[:513]]


def interleaved(c, inputs):
    """Streams 10, 11, ... of `inputs` through client c, all open at once, pushed in odd
    interleaved chunks with a flush now and then; their committed rows, one array a stream."""
    for s in range(len(inputs)):
        assert c.open(s + 10) == 0
    got = {s + 10: [] for s in range(len(inputs))}
    provisional = 0
    for start in range(0, max(len(t) for t in inputs), 97):
        for s, t in enumerate(inputs):
            if start < len(t):
                c.push(s + 10, t[start:start + 97])
                if start % 5 == 0:
                    c.flush(s + 10)
        for r in c.replies():
            if r.provisional:
                provisional += 1
                assert r.position == len(b"".join(x.tobytes() for x in got[r.stream])) // (4 * 128)
            else:
                got[r.stream].append(r.rows)
    for s in range(len(inputs)):
        c.close(s + 10)
    finals = 0
    for r in c:
        finals += r.final
        if not r.provisional:
            got[r.stream].append(r.rows)
    assert finals == len(inputs) and provisional > 0
    return [np.concatenate(got[s + 10]) for s in range(len(inputs))]


def test_rows_equal_run(binary, serve):
    endpoint = serve(*MODEL)
    inputs = texts()
    with seqflow.Client(endpoint, timeout=30) as c:
        got = interleaved(c, inputs)
    for rows, t in zip(got, inputs):
        assert rows.shape == (len(t), 128) and rows.dtype == np.float32
        assert rows.tobytes() == run_rows(binary, t)


def metrics(port):
    """The server's /metrics (--http) as {name with labels: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as f:
        lines = f.read().decode().splitlines()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))}


def seen_types(c):
    """The message types client c handles from here on (a list that fills as it reads)."""
    types, handle = [], c._handle
    c._handle = lambda data: types.append(data[5]) or handle(data)
    return types


def test_shared_memory_rows(binary, serve):
    """Rows through a shared-memory region (the server's default size) equal the socket's and
    `seqflow run`'s, and the region was used: the server counts its ROWS_AT, all RELEASEd."""
    port = _free_port()
    endpoint = serve(*MODEL, "--http", f"tcp://127.0.0.1:{port}")
    inputs = texts()
    with seqflow.Client(endpoint, timeout=30) as c:
        plain = interleaved(c, inputs)
    with seqflow.Client(endpoint, timeout=30, shared_memory=True) as c:
        assert c._region is not None and c._version == 4
        types = seen_types(c)
        shm = interleaved(c, inputs)
        c.sync()  # every RELEASE handled
        m = metrics(port)
    assert m["seqflow_serve_shm_rows_total"] == types.count(23) > 0
    assert m["seqflow_serve_shm_regions"] == 1 and m['seqflow_serve_shm_bytes{kind="in_use"}'] == 0
    for a, b, t in zip(shm, plain, inputs):
        assert a.tobytes() == b.tobytes() == run_rows(binary, t)
        assert a.flags.writeable  # copied out of the region


def test_shared_memory_and_socket(binary, serve):
    """A region of 64 KiB holds the 40-row flushes (20 KiB) but not a segment's 256 rows
    (128 KiB): those come over the socket to the same client, and a stream's rows keep their
    order either way."""
    endpoint = serve(*MODEL)
    text = seqflow.builtin_text()
    with seqflow.Client(endpoint, timeout=30, shared_memory=True, shared_memory_bytes=1 << 16) as c:
        assert len(c._region) == 1 << 16
        types = seen_types(c)
        c.open(1)
        pushed = 0
        for end in (40, 552, 1064, len(text)):
            c.push(1, text[pushed:end])
            pushed = end
            if end < len(text):
                c.flush(1)
        c.close(1)
        got = list(c)
    committed = [r.rows for r in got if not r.provisional]
    assert [len(r.rows) for r in got if r.provisional] == [40, 40, 40]
    assert np.concatenate(committed).tobytes() == run_rows(binary, text)
    assert types.count(23) == 3 and types.count(17) == len(committed)  # the flushes in the region, no segment


def test_shared_memory_refused(binary, serve):
    """A server without shared memory refuses MAP: the client warns and its rows come over the
    socket, the same rows."""
    port = _free_port()
    endpoint = serve(*MODEL, "--shm-budget", "0", "--http", f"tcp://127.0.0.1:{port}")
    text = seqflow.builtin_text()[:1500]
    with pytest.warns(RuntimeWarning, match="REGION"):
        c = seqflow.Client(endpoint, timeout=30, shared_memory=True)
    with c:
        assert c._region is None and c._version == 3
        assert c.run(1, text).tobytes() == run_rows(binary, text)
    m = metrics(port)
    assert m["seqflow_serve_shm_rows_total"] == 0 and m["seqflow_serve_shm_regions"] == 0


def test_rows_equal_pipeline(serve):
    endpoint = serve("-t", "1")  # the built-in model, as Pipeline(model=None) has it
    text = seqflow.builtin_text()
    with seqflow.Pipeline(threads=1) as p:
        want = p.run(text)
    with seqflow.Client(endpoint, timeout=30) as c:
        rows = c.run(3, text)
    assert rows.shape == want.shape and rows.tobytes() == want.tobytes()


def test_two_clients_at_once(binary, serve):
    endpoint = serve(*MODEL, "--window", "1024")  # a push larger than the window waits for rows
    text = seqflow.builtin_text() * 3
    results, errors = {}, []

    def client(k):
        try:
            with seqflow.Client(endpoint, timeout=30) as c:
                results[(k, 0)] = c.run(100 + 2 * k, text[k:])
                c.open(101 + 2 * k)
                c.push(101 + 2 * k, text[:777 + k])
                c.close(101 + 2 * k)
                results[(k, 1)] = np.concatenate([r.rows for r in c])
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for k in range(2):
        assert results[(k, 0)].tobytes() == run_rows(binary, text[k:])
        assert results[(k, 1)].tobytes() == run_rows(binary, text[:777 + k])


def test_bad_requests_raise(serve):
    endpoint = serve(*MODEL)
    with seqflow.Client(endpoint, timeout=30) as a, seqflow.Client(endpoint, timeout=30) as b:
        assert a.open(1) == 0
        with pytest.raises(seqflow.ServeError) as e:
            b.open(1)  # another client has it
        assert e.value.name == "BUSY" and e.value.code == 4 and "another client" in e.value.message
        a.push(1, b"abc")
        a.push(1, [65, 300, 66])  # 300 is outside the byte vocabulary: nothing of it is taken
        with pytest.raises(seqflow.ServeError) as e:
            a.sync()  # the ERROR of a PUSH comes back asynchronously; sync() waits for it
        assert e.value.name == "TOKEN" and e.value.stream == 1
        assert "token 300 at position 4 is outside the vocabulary" in e.value.message
        with pytest.raises(seqflow.ServeError):
            a.push(1, b"d")  # the stream's position is unknown until it is opened again
        assert a.open(1) == 3  # the server took "abc" only
        a.push(1, b"d")
        a._send(2, 1, 4, 0)  # a PUSH of 0 tokens does not decode
        with pytest.raises(seqflow.ServeError) as e:
            a.recv(timeout=10)
        assert e.value.name == "MALFORMED"
        a.sync()  # nothing else was refused
        with pytest.raises(ValueError):
            a.push(2, b"x")  # never opened: refused before anything is sent
        a.close(1)
        rows = [r for r in a]
        assert rows[-1].final and sum(len(r.rows) for r in rows) == 4
        assert b.open(1) == 0  # closed: free for anyone, from position 0


def test_curve(binary, serve, tmp_path):
    try:
        server_public, server_secret = seqflow.curve_keypair()
    except OSError:
        pytest.skip("libzmq without CURVE")
    client_public, client_secret = seqflow.curve_keypair()
    key, clients = tmp_path / "server.key", tmp_path / "clients.txt"
    key.write_text(server_secret + "\n")
    key.chmod(0o600)
    clients.write_text("# admitted\n" + client_public + "\n")
    endpoint = serve(*MODEL, "--key", str(key), "--clients", str(clients), plaintext=False)
    assert seqflow.curve_public(server_secret) == server_public
    text = seqflow.builtin_text()[:600]
    with seqflow.Client(endpoint, server_key=server_public, client_keys=client_secret, timeout=30) as c:
        assert c.run(1, text).tobytes() == run_rows(binary, text)
    stranger = seqflow.curve_keypair()
    with seqflow.Client(endpoint, server_key=server_public, client_keys=stranger, timeout=20) as c:
        with pytest.raises(seqflow.ServeError, match="refused this client's CURVE key") as e:
            c.open(2)
        assert e.value.name == "REFUSED"
    with seqflow.Client(endpoint, timeout=3) as c:  # plaintext to a CURVE server: never answered
        with pytest.raises((TimeoutError, seqflow.ServeError)):
            c.open(3)
    with pytest.raises(ValueError):
        seqflow.Client(endpoint, server_key=server_public)  # CURVE without this client's keys


def test_bf16_rows_equal_pipeline(serve):
    chain = "segment ! embed ! block ! norm dtype=bf16"
    endpoint = serve("-t", "1", chain)  # the built-in model, as Pipeline(model=None) has it
    text = seqflow.builtin_text()[:700]
    with seqflow.Client(endpoint, timeout=30) as c:
        rows = c.run(1, text)
    with seqflow.Pipeline(chain, threads=1) as p:
        want = p.run(text)
    assert rows.dtype == np.uint16 and want.dtype == np.uint16 and rows.shape == (700, 128)
    assert rows.tobytes() == want.tobytes()


@pytest.mark.parametrize("shared_memory", [False, True])
def test_resume_after_sigkill(binary, tmp_path, shared_memory):
    """A server killed with SIGKILL mid-stream and restarted on its checkpoint directory: the
    client resumes by itself and its committed rows are `seqflow run`'s, each once. With shared
    memory the client maps the new server's region."""
    folder = tempfile.mkdtemp(prefix="sfr")  # short: an ipc path is at most 107 bytes
    endpoint = f"ipc://{folder}/s"
    cmd = [binary, "serve", "--bind", endpoint, "-q", "--plaintext", "--checkpoint", str(tmp_path / "ckpt"),
           "--checkpoint-every", "0.05"] + MODEL

    def start():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(200):
            if os.path.exists(endpoint[len("ipc://"):]) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1].decode()
        return proc

    text = seqflow.builtin_text()[:6000]
    proc = start()
    try:
        rows = []
        with seqflow.Client(endpoint, resume_timeout=20, shared_memory=shared_memory) as c:
            region = c._region
            types = seen_types(c)
            c.open(7)
            c.push(7, text[:3000])
            deadline = time.monotonic() + 30
            while c._streams[7].base < 1000 and time.monotonic() < deadline:  # durable past 1000
                r = c.recv(timeout=0.1)
                if r is not None:
                    rows.append(r)
            assert c._streams[7].base >= 1000
            proc.kill()
            proc.wait()
            proc = start()
            c.push(7, text[3000:])
            c.close(7)
            rows += [r for r in c if not r.provisional]
            if shared_memory:
                assert c._region is not None and c._region is not region and region.closed
                assert types.count(22) == 1 and 23 in types[types.index(22):]  # rows in the new region
        got = np.concatenate([r.rows for r in rows if not r.provisional])
        positions = [r.position for r in rows if not r.provisional]
        assert positions == sorted(positions) and got.shape[0] == len(text)
        assert got.tobytes() == run_rows(binary, text)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


class _DropProxy:
    """A TCP relay to the server on 127.0.0.1:`port` that, once armed, cuts the client's
    connection as its next OPEN passes, before any reply comes back: with forward=True the OPEN
    reaches the server first (which opens the stream for that connection), else it is lost."""

    def __init__(self, port):
        self.port_to = port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.armed = None  # None, "forward" or "drop"
        self.blocked = False  # replies to the connection being cut are not relayed
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.port_to))
            self.blocked = False
            for src, dst, up in ((c, s, True), (s, c, False)):
                threading.Thread(target=self._pump, args=(src, dst, up, (c, s)), daemon=True).start()

    def _pump(self, src, dst, up, pair):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if up and self.armed and b"SFS1\x03\x01" in data:  # version 3, type OPEN
                    mode, self.armed, self.blocked = self.armed, None, True
                    if mode == "forward":
                        dst.sendall(data)
                        time.sleep(0.3)  # the server takes it (its OPENED goes nowhere)
                    self.cuts += 1
                    break
                if not up and self.blocked:
                    continue
                dst.sendall(data)
        except OSError:
            pass
        for x in pair:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()

    def close(self):
        self.listener.close()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("checkpoint", [True, False])
def test_open_interrupted_before_opened(binary, tmp_path, checkpoint):
    """The connection drops after open() sent OPEN and before OPENED came: open() resumes on a
    fresh connection and returns 0, whether the OPEN reached the server or not (a server with
    checkpoints hands the stream over to the new connection; one that never saw the OPEN opens
    it), and the stream's rows are `seqflow run`'s. A server without checkpoints that took the
    OPEN holds the stream for the dropped connection: open() raises BUSY, saying why, and the
    client goes on with other streams."""
    port = _free_port()
    cmd = [binary, "serve", "--bind", f"tcp://127.0.0.1:{port}", "-q", "--plaintext", "--idle-timeout", "30"] + MODEL
    if checkpoint:
        cmd += ["--checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "0.05"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proxy = _DropProxy(port)
    try:
        for _ in range(200):  # listening
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1].decode()
                time.sleep(0.05)
        text = seqflow.builtin_text()[:700]
        with seqflow.Client(f"tcp://127.0.0.1:{proxy.port}", timeout=30, resume_timeout=10) as c:
            c.sync()  # connected
            for stream, mode in ((2, "drop"), (3, "forward")):
                proxy.armed = mode
                cuts = proxy.cuts
                if mode == "forward" and not checkpoint:
                    with pytest.raises(seqflow.ServeError, match="dropped before OPENED") as e:
                        c.open(stream)
                    assert e.value.name == "BUSY" and proxy.cuts == cuts + 1
                    assert stream not in c._streams
                    stream = 4  # the client goes on: another stream opens
                    assert c.open(stream) == 0
                else:
                    assert c.open(stream) == 0
                    assert proxy.cuts == cuts + 1
                c.push(stream, text)
                c.close(stream)
                rows = [r for r in c if r.stream == stream and not r.provisional]
                got = np.concatenate([r.rows for r in rows])
                assert got.tobytes() == run_rows(binary, text)
    finally:
        proxy.close()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
