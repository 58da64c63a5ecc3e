"""seqflow.torch trains: 50 steps of a tiny model on the built-in text lower the loss, with the
state carried across segments (truncated BPTT), and the trained model, exported, streams through
Pipeline to the module's own hidden states."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import seqflow  # noqa: E402
from seqflow.torch import SeqflowConfig, SeqflowModel  # noqa: E402

TINY = SeqflowConfig(dim=32, heads=2, head_dim=16, vocab=256, layers=1, segment=32,
                     branches=[(8, 1), (16, 2), (32, 4)], memory="delta", global_tokens=4,
                     summary_tokens=2, mlp_hidden=64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(0)
    text = seqflow.builtin_text()
    data = torch.tensor(list(text), dtype=torch.long)
    streams = 4
    per = (data.numel() // streams) // (2 * TINY.segment) * (2 * TINY.segment)
    batch = data[:streams * per].view(streams, per)   # 4 streams of whole segments
    model = SeqflowModel(TINY)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def evaluate():
        with torch.no_grad():
            return float(model.loss(batch)[0])

    before = evaluate()
    losses = []
    for step in range(50):
        # two halves per step: the state of the first carries into the second, detached
        # between segments (truncated backpropagation through time)
        state, total = None, 0.0
        for half in (batch[:, :per // 2], batch[:, per // 2:]):
            loss, state = model.loss(half, state, detach=True)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state = state.detach()
            total += loss.item()
        losses.append(total / 2)
    after = evaluate()
    path = model.save_pretrained(str(tmp_path_factory.mktemp("trained")))
    return model.eval(), before, after, losses, path, text


def test_loss_goes_down(trained):
    model, before, after, losses, path, text = trained
    assert all(np.isfinite(losses))
    assert before > 4.0                      # near ln(256) = 5.5 untrained (measured: 6.1 -> 1.4)
    assert after < 0.8 * before, (before, after)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5


def test_gradients_reach_every_parameter():
    model = SeqflowModel(TINY)
    loss, _ = model.loss(torch.tensor(list(b"the gradients reach every weight " * 4)))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_trained_export_streams_through_pipeline(trained):
    model, before, after, losses, path, text = trained
    with torch.no_grad():
        want, _ = model(torch.tensor(list(text), dtype=torch.long))
    got = []
    with seqflow.Pipeline(model=path) as p:
        for lo in range(0, len(text), 100):
            p.push(text[lo:lo + 100])
            got += [rows for _, rows in p]
        p.end()
        got += [rows for _, rows in p]
    got = np.concatenate(got)
    want = want.numpy()
    assert got.shape == want.shape == (len(text), TINY.dim)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-5
