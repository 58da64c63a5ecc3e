"""Pipeline and the package around it: bad inputs raise clean Python exceptions carrying seqflow's
text (nothing crashes), rows are zero-copy views, the GIL is released, the library is found."""
import os
import subprocess
import sys

import numpy as np
import pytest

import seqflow
from seqflow import Pipeline, SeqflowError

SF_E_IO, SF_E_MODEL, SF_E_TOKEN, SF_E_PARSE, SF_E_STAGE, SF_E_OPTION, SF_E_CLOSED = -3, -4, -6, -8, -9, -10, -13


def test_unknown_stage():
    with pytest.raises(SeqflowError) as e:
        Pipeline("segment ! embed ! frobnicate ! norm")
    assert e.value.code == SF_E_STAGE
    assert "frobnicate" in str(e.value) and e.value.name  # sf_last_error's and sf_strerror's text


def test_bad_option_value_names_stage_and_option():
    with pytest.raises(SeqflowError) as e:
        Pipeline("segment max_streams=0 ! embed ! block ! norm")
    assert e.value.code == SF_E_OPTION
    assert "segment" in e.value.message and "max_streams" in e.value.message


def test_source_in_the_middle():
    with pytest.raises(SeqflowError) as e:
        Pipeline("segment ! source ! embed")
    assert e.value.code == SF_E_PARSE


def test_bad_python_arguments():
    with pytest.raises(ValueError):
        Pipeline("   ")
    with pytest.raises(TypeError, match="unknown option 'thread'"):
        Pipeline(thread=2)
    with pytest.raises(ValueError, match="precision"):
        Pipeline(precision="f16")


def test_missing_and_broken_model_files(tmp_path):
    with pytest.raises(SeqflowError) as e:
        Pipeline(model=tmp_path / "none.safetensors")
    assert e.value.code == SF_E_IO and "none.safetensors" in e.value.message
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(SeqflowError) as e:
        Pipeline(model=bad)
    assert e.value.code == SF_E_MODEL


def test_tokens_outside_the_vocabulary():
    with Pipeline() as p:
        with pytest.raises(SeqflowError) as e:
            p.push(np.full(300, 256, dtype=np.uint32))  # a whole segment: embed sees it
        assert e.value.code == SF_E_TOKEN and "256" in e.value.message


def test_tokens_of_the_wrong_kind():
    with Pipeline() as p:
        with pytest.raises(ValueError, match="uint32"):
            p.push([1, -2, 3])
        with pytest.raises(ValueError, match="uint32"):
            p.push([2 ** 32])
        with pytest.raises(TypeError, match="integers"):
            p.push(np.array([1.5, 2.0]))
        with pytest.raises(ValueError, match="one-dimensional"):
            p.push(np.zeros((2, 2), dtype=np.uint32))
        with pytest.raises(ValueError, match="stream"):
            p.push(b"x", stream=-1)
        p.push(b"still works")
        p.end()
        assert sum(r.shape[0] for _, r in p) == len(b"still works")


def test_unavailable_devices():
    for device in ("tpu", "cuda"):  # this build (CPU tests) has no CUDA backend, or no GPU
        try:
            Pipeline(device=device).close()
        except SeqflowError as e:
            assert e.code == -11 and e.message  # SF_E_BACKEND, saying why
        else:
            assert device == "cuda", "an unknown device was accepted"


def test_pipeline_without_rows():
    with Pipeline("segment") as p:
        p.push(b"x" * 300)
        with pytest.raises(SeqflowError, match="no hidden rows"):
            p.pull()


def test_bf16_rows():
    text = b"bfloat16 rows are the upper halves of float32 " * 8
    with Pipeline("segment ! embed ! block ! norm dtype=bf16") as p:
        bits = p.run(text)
    with Pipeline() as p:
        rows = p.run(text)
    assert bits.dtype == np.uint16 and bits.shape == rows.shape
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(widened - rows) <= np.abs(rows) * 2.0 ** -8 + 1e-30)


def test_closed_pipeline():
    p = Pipeline()
    p.close()
    p.close()  # idempotent
    assert p.closed
    with pytest.raises(SeqflowError) as e:
        p.push(b"abc")
    assert e.value.code == SF_E_CLOSED


def test_rows_outlive_the_pipeline():
    """Pulled rows are views of the packet (no copy) and stay valid after close()."""
    p = Pipeline()
    p.push(b"rows are numpy views of the packets" * 10)
    r = p.pull()
    view = r.rows[1:3]
    copy = view.copy()
    p.close()
    del r
    assert np.array_equal(view, copy) and np.isfinite(view).all()


def test_zero_copy_rows():
    with Pipeline() as p:
        p.push(b"x" * 256)
        (stream, rows), = list(p)
    assert stream == 0 and rows.shape == (256, 128)
    assert not rows.flags.owndata and type(rows.base).__name__ == "_PacketRows"


def test_missing_library_is_an_os_error(tmp_path):
    code = "import seqflow\ntry:\n    seqflow.Pipeline()\nexcept OSError as e:\n    print('OSError', e)\n"
    env = dict(os.environ, SEQFLOW_LIB=str(tmp_path / "nowhere.so"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("OSError") and "SEQFLOW_LIB" in out.stdout


def test_builtin_model_and_text_match_the_binary(binary, tmp_path):
    """Pipeline() is the binary's default run: built-in model, built-in text, same rows."""
    out = tmp_path / "h.npy"
    subprocess.run([binary, "run", "-q", "-o", str(out)], check=True)
    with Pipeline() as p:
        rows = p.run(seqflow.builtin_text())
    assert np.array_equal(rows, np.load(out))


torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from seqflow.torch import SeqflowConfig, SeqflowModel  # noqa: E402


def test_bad_configs():
    with pytest.raises(ValueError, match="branch 5:1"):
        SeqflowConfig(segment=16, branches=[(5, 1)])
    with pytest.raises(ValueError, match="memory"):
        SeqflowConfig(memory="lstm")
    with pytest.raises(ValueError, match="branches"):
        SeqflowConfig(branches="64-1")


def test_bad_tokens_for_the_module():
    m = SeqflowModel(SeqflowConfig(dim=16, heads=2, head_dim=8, layers=1, segment=8, branches=[(8, 1)],
                                   global_tokens=0, summary_tokens=0, mlp_hidden=0))
    with pytest.raises(ValueError, match="token 256"):
        m(torch.tensor([1, 256]))
    with pytest.raises(TypeError, match="integers"):
        m(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="shape"):
        m(torch.zeros(1, 2, 3, dtype=torch.long))


def test_from_pretrained_refuses_incomplete_files(tmp_path):
    from safetensors.torch import save_file
    m = SeqflowModel(SeqflowConfig(dim=16, heads=2, head_dim=8, layers=1, segment=8, branches=[(8, 1)],
                                   global_tokens=0, summary_tokens=0, mlp_hidden=0))
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    del tensors["blocks.0.attn.gate"]
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata=m.config.metadata())
    with pytest.raises(ValueError, match="blocks.0.attn.gate"):
        SeqflowModel.from_pretrained(str(tmp_path / "m.safetensors"))
    with pytest.raises(SeqflowError) as e:  # and the C library refuses it too, naming the tensor
        Pipeline(model=tmp_path / "m.safetensors")
    assert e.value.code == SF_E_MODEL and "gate" in e.value.message


def test_library_search_order(tmp_path):
    """Without SEQFLOW_LIB the library is looked for in the recorded build tree, then at
    pkg-config's libdir, then on the loader's path."""
    import shutil
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config is not installed")
    (tmp_path / "seqflow.pc").write_text("prefix=/opt/sf\nlibdir=/opt/sf/lib\nName: seqflow\n"
                                         "Description: x\nVersion: 0.1.0\nLibs: -L${libdir} -lseqflow\n")
    code = "from seqflow import _lib\nprint('\\n'.join(_lib._candidates()))\n"
    env = {k: v for k, v in os.environ.items() if k != "SEQFLOW_LIB"}
    env["PKG_CONFIG_PATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    tried = out.stdout.split()
    assert out.returncode == 0 and tried[-2:] == ["/opt/sf/lib/libseqflow.so.0", "libseqflow.so.0"], out
    env["SEQFLOW_LIB"] = "/somewhere/libseqflow.so"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["/somewhere/libseqflow.so"]


def test_push_releases_the_gil():
    """While a push computes in C, other Python threads run (ctypes releases the GIL): the
    longest pause of a counting loop during a push stays well under the push's duration."""
    import threading
    import time
    tokens = np.frombuffer(seqflow.builtin_text() * 8, dtype=np.uint8).astype(np.uint32)
    with Pipeline(threads=1) as p:
        p.push(tokens[:256])  # warm up: first allocations
        done = threading.Event()
        span = []

        def work():
            t0 = time.perf_counter()
            p.push(tokens)
            span.append(time.perf_counter() - t0)
            done.set()

        th = threading.Thread(target=work)
        last, gap = time.perf_counter(), 0.0
        th.start()
        while not done.is_set():
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        gap = max(gap, time.perf_counter() - last)
        th.join()
        assert sum(r.shape[0] for _, r in p) > 0
    assert span[0] > 0.05, "the push was too short to tell"
    assert gap < 0.5 * span[0], f"a pause of {gap:.3f} s during a push of {span[0]:.3f} s"
