"""seqflow from Python.

- seqflow.Pipeline: a pipeline of the C library (libseqflow.so, through ctypes) fed token by
  token, its hidden states handed out as numpy arrays.
- seqflow.Client: a client of `seqflow serve` (libzmq through ctypes): many streams served by
  one server process, their rows handed out as numpy arrays.
- seqflow.torch: the model of docs/SPEC.md as a trainable torch.nn.Module that reads and writes
  seqflow model files (imported on demand: PyTorch is needed only there).
"""
from .pipeline import DEFAULT_PIPELINE, Pipeline, Result, SeqflowError, builtin_text
from ._lib import library_path
from .client import Client, Rows, ServeError, curve_keypair, curve_public

__version__ = "0.1.0"
__all__ = ["Client", "Rows", "ServeError", "curve_keypair", "curve_public", "Pipeline", "Result", "SeqflowError", "builtin_text", "library_path", "DEFAULT_PIPELINE"]
