"""Shared fixtures: where the seqflow binary is, and the two model shapes the tests compare."""
import os
import shutil

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def seqflow_binary():
    """$SEQFLOW_BIN, the checkout's build/seqflow, or seqflow on the PATH."""
    env = os.environ.get("SEQFLOW_BIN")
    if env:
        return env
    local = os.path.join(HERE, "..", "..", "build", "seqflow")
    if os.path.exists(local):
        return local
    return shutil.which("seqflow")


@pytest.fixture(scope="session")
def binary():
    path = seqflow_binary()
    if not path:
        pytest.skip("the seqflow binary was not found (set SEQFLOW_BIN)")
    return path


def shapes():
    """Two model shapes that differ in everything the contract lets vary: causal or not, delta or
    linear memory, global tokens or none, MLP or none, final norm or none, H*d equal to D or not,
    byte or larger vocabulary."""
    from seqflow.torch import SeqflowConfig
    return {
        "causal-delta-global-mlp": SeqflowConfig(dim=32, heads=2, head_dim=16, vocab=256, layers=2, segment=16,
                                                 branches=[(4, 1), (8, 2), (16, 4)], memory="delta",
                                                 global_tokens=4, summary_tokens=2, mlp_hidden=64),
        "bidirectional-linear-plain": SeqflowConfig(dim=24, heads=3, head_dim=8, vocab=300, layers=1, segment=12,
                                                    branches=[(6, 1), (12, 3)], causal=False, memory="linear",
                                                    global_tokens=0, summary_tokens=0, mlp_hidden=0,
                                                    final_norm=False),
    }


def pytest_configure(config):
    # The models here are tiny: one thread is faster than several that spin waiting for each
    # other, above all on a CI machine with 2 cores that other jobs share.
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
