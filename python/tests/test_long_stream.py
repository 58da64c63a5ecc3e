"""A Pipeline fed a long stream keeps flat memory: the state is bounded (SPEC 4-5) and rows are
freed as they are consumed. SEQFLOW_LONG_TOKENS sets the length (default 1.5M tokens, ~10 s on
a 2-core machine; 10M was measured by hand, see docs/PYTHON.md)."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
import seqflow  # noqa: E402
from seqflow.torch import SeqflowConfig, SeqflowModel  # noqa: E402


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def test_long_stream_keeps_flat_memory(tmp_path):
    torch.manual_seed(0)
    m = SeqflowModel(SeqflowConfig(dim=16, heads=1, head_dim=16, layers=1, segment=64, branches=[(64, 1)],
                                   memory="delta", global_tokens=2, summary_tokens=1, mlp_hidden=0))
    path = m.save_pretrained(str(tmp_path / "m.safetensors"))
    total = int(os.environ.get("SEQFLOW_LONG_TOKENS", 1_500_000))
    chunk = np.random.default_rng(0).integers(0, 256, 65536).astype(np.uint32)
    rounds = max(8, total // chunk.size)
    rows = 0
    with seqflow.Pipeline(model=path, threads=1) as p:
        for i in range(rounds):
            p.push(chunk)
            for _, r in p:
                rows += r.shape[0]
                assert np.isfinite(r[-1]).all()
            if i == rounds // 4:
                early = rss_kib()
        late = rss_kib()
        p.end()
        rows += sum(r.shape[0] for _, r in p)
    assert rows == rounds * chunk.size
    assert late - early < 4096, f"resident memory grew by {late - early} KiB over {rows} tokens"
