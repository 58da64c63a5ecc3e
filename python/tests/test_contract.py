"""seqflow.torch computes what the C library computes (SPEC 2-6): hidden states of an exported
module equal `seqflow run`'s and Pipeline's within 1e-5 (float32, CPU)."""
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import seqflow  # noqa: E402
from seqflow.torch import SeqflowModel  # noqa: E402

from conftest import shapes  # noqa: E402

TOL = 1e-5


def rel_error(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def model_and_tokens(cfg, T, seed):
    torch.manual_seed(seed)
    m = SeqflowModel(cfg)
    with torch.no_grad():  # gates away from 0 so that memory and attention weigh differently per head
        for b in m.blocks:
            b.attn.gate.normal_(0.0, 1.5)
    tokens = torch.randint(0, cfg.vocab, (T,))
    return m.eval(), tokens


@pytest.fixture(params=list(shapes()), scope="module")
def exported(request, tmp_path_factory):
    cfg = shapes()[request.param]
    # several segments and a partial last one, so that memory, global tokens and the end of a
    # stream all take part
    m, tokens = model_and_tokens(cfg, 7 * cfg.segment + 5, seed=1)
    path = m.save_pretrained(str(tmp_path_factory.mktemp(request.param) / "m.safetensors"))
    with torch.no_grad():
        hidden, _ = m(tokens)
    return m, tokens, path, hidden.numpy()


def test_binary_matches_module(exported, binary, tmp_path):
    m, tokens, path, hidden = exported
    tok_file, out = tmp_path / "t.u32", tmp_path / "h.npy"
    tokens.numpy().astype("<u4").tofile(tok_file)
    subprocess.run([binary, "run", "-q", "-m", path, "-i", str(tok_file), "-f", "u32", "-o", str(out)], check=True)
    got = np.load(out)
    assert got.shape == hidden.shape
    assert rel_error(got, hidden) <= TOL
    assert np.abs(got - hidden).max() <= 1e-4 * max(1.0, float(np.abs(hidden).max()))


def test_pipeline_matches_module(exported):
    m, tokens, path, hidden = exported
    with seqflow.Pipeline(model=path, threads=1) as p:
        got = p.run(tokens.numpy())
    assert got.dtype == np.float32 and got.shape == hidden.shape
    assert rel_error(got, hidden) <= TOL


def test_pipeline_takes_the_module_itself(exported):
    m, tokens, path, hidden = exported
    with seqflow.Pipeline(model=m) as p:
        got = p.run(tokens[:40])
    with torch.no_grad():
        want, _ = m(tokens[:40])
    assert rel_error(got, want.numpy()) <= TOL


def test_from_pretrained_round_trip(exported):
    m, tokens, path, hidden = exported
    m2 = SeqflowModel.from_pretrained(path)
    assert m2.config == m.config
    for (k, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    with torch.no_grad():
        again, _ = m2(tokens)
    assert np.array_equal(again.numpy(), hidden)


def test_state_carried_across_calls(exported):
    """Segment by segment through the returned state equals one call over the whole stream."""
    m, tokens, path, hidden = exported
    N = m.config.segment
    state, parts = None, []
    with torch.no_grad():
        for lo in range(0, tokens.shape[0], 2 * N):
            h, state = m(tokens[lo:lo + 2 * N], state)
            parts.append(h)
    assert state.ended and state.position == tokens.shape[0]
    assert torch.allclose(torch.cat(parts), torch.from_numpy(hidden), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="ended"):
        m(tokens[:3], state)


def test_batched_streams_are_independent(exported):
    m, tokens, path, hidden = exported
    other = torch.randint(0, m.config.vocab, tokens.shape)
    with torch.no_grad():
        both, _ = m(torch.stack([tokens, other]))
        alone, _ = m(other)
    assert torch.allclose(both[0], torch.from_numpy(hidden), atol=1e-5)
    assert torch.allclose(both[1], alone, atol=1e-5)


def test_pipeline_streams_in_chunks_and_flush(exported):
    """Chunks of odd sizes on two interleaved streams give each stream's one-call rows; a flush
    gives provisional rows (those of the stream ending there, SPEC 1) and commits nothing."""
    m, tokens, path, hidden = exported
    N = m.config.segment
    a = tokens.numpy()
    b = a[::-1].copy()
    cut = N + N // 2
    rows = {0: [], 7: []}
    with seqflow.Pipeline(model=path) as p:
        p.push(a[:cut], stream=0)
        p.push(b[:5], stream=7)
        p.flush(stream=0)
        early = list(iter(p.pull, None))
        provisional = [r for r in early if r.provisional]
        for r in early:
            if not r.provisional and r.rows.shape[0]:
                rows[r.stream].append(r.rows)
        assert len(provisional) == 1 and provisional[0].stream == 0 and provisional[0].position == N
        with torch.no_grad():
            prefix, _ = m(tokens[:cut])
        assert rel_error(provisional[0].rows, prefix[N:].numpy()) <= TOL
        if m.config.causal:  # a flushed prefix gives what the completed segment will
            assert rel_error(provisional[0].rows, hidden[N:cut]) <= TOL
        pos7 = 5
        for lo in range(cut, a.size, 13):
            p.push(a[lo:lo + 13], stream=0)
            p.push(b[pos7:pos7 + 11], stream=7)
            pos7 += 11
        p.push(b[pos7:], stream=7)
        p.end(0)
        p.end(7)
        for s, r in p:
            rows[s].append(r)
    assert rel_error(np.concatenate(rows[0]), hidden) <= TOL
    got7 = np.concatenate(rows[7])
    with torch.no_grad():
        want7, _ = m(torch.from_numpy(b[:got7.shape[0]].astype(np.int64)))
    assert got7.shape[0] == b.size
    assert rel_error(got7, want7.numpy()) <= TOL
