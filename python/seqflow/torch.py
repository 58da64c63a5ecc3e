"""The seqflow contract (docs/SPEC.md sections 2-6) as a trainable PyTorch module.

`SeqflowModel` computes what the C library computes: segments of N tokens, local dilated
attention (LongNet branches merged by their log-sum-exp with the global tokens), the compressive
memory (Infini-attention, linear or delta rule, mixed in by a per-head gate), the global-token
FIFO, the optional SwiGLU MLP, RMSNorms and the optional final norm. Its parameters are named
exactly as the tensors of a seqflow model file, so `save_pretrained` writes a file that
`seqflow run -m FILE` and `seqflow.Pipeline` read, and `from_pretrained` reads one back.

The state of a stream (memory M and z, the global tokens of every layer) is carried across
segments and across calls as a `SeqflowState`; gradients flow through it unless `detach=True`
(truncated backpropagation through time: the graph is cut after every segment).
"""
import math
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SeqflowConfig", "SeqflowState", "SeqflowModel"]

MODEL_FILE = "model.safetensors"

# A finite stand-in for -inf in masked scores and absent log-sum-exps: exp(MASKED - s) is exactly
# 0 in float32 for any real score s, and no gradient ever meets inf - inf.
_MASKED = -1e30


@dataclass
class SeqflowConfig:
    """The configuration of a model (SPEC 6; the names of `seqflow info`)."""
    dim: int = 128
    heads: int = 4
    head_dim: int = 32
    vocab: int = 256
    layers: int = 2
    segment: int = 256
    branches: List[Tuple[int, int]] = field(default_factory=lambda: [(64, 1), (128, 2), (256, 4)])
    causal: bool = True
    memory: str = "delta"
    global_tokens: int = 16
    summary_tokens: int = 4
    norm_eps: float = 1e-6
    mlp_hidden: int = 256
    final_norm: bool = True

    def __post_init__(self):
        if isinstance(self.branches, str):
            self.branches = parse_branches(self.branches)
        self.branches = [(int(w), int(r)) for w, r in self.branches]
        self.validate()

    def validate(self):
        """Raises ValueError naming the first broken rule of SPEC 3-6."""
        for name in ("dim", "heads", "head_dim", "vocab", "layers", "segment"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"seqflow config: {name} is {getattr(self, name)}; it must be positive")
        if not self.branches:
            raise ValueError("seqflow config: at least one branch (window:dilation) is needed")
        if len(self.branches) > 16:
            raise ValueError(f"seqflow config: {len(self.branches)} branches; at most 16")
        for w, r in self.branches:
            if w <= 0 or r <= 0 or self.segment % w or w % r:
                raise ValueError(f"seqflow config: branch {w}:{r}: the window must divide the segment "
                                 f"({self.segment}) and the dilation the window")
        if self.memory not in ("none", "linear", "delta"):
            raise ValueError(f"seqflow config: memory {self.memory!r}: one of none, linear, delta")
        if self.global_tokens < 0 or self.summary_tokens < 0 or self.summary_tokens > self.segment:
            raise ValueError("seqflow config: global_tokens and summary_tokens must be >= 0, "
                             "summary_tokens <= segment")
        if self.mlp_hidden < 0:
            raise ValueError("seqflow config: mlp_hidden must be >= 0 (0: no MLP)")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ValueError(f"seqflow config: norm_eps is {self.norm_eps}; it must be positive and finite")

    def metadata(self):
        """The safetensors `__metadata__` of this configuration (SPEC 6: strings)."""
        return {
            "seqflow.dim": str(self.dim), "seqflow.heads": str(self.heads),
            "seqflow.head_dim": str(self.head_dim), "seqflow.vocab": str(self.vocab),
            "seqflow.layers": str(self.layers), "seqflow.segment": str(self.segment),
            "seqflow.branches": ",".join(f"{w}:{r}" for w, r in self.branches),
            "seqflow.causal": "1" if self.causal else "0", "seqflow.memory": self.memory,
            "seqflow.global_tokens": str(self.global_tokens),
            "seqflow.summary_tokens": str(self.summary_tokens),
            "seqflow.norm_eps": repr(float(self.norm_eps)),
        }

    @classmethod
    def from_metadata(cls, meta, tensors):
        """The configuration of a model file: its metadata, with the MLP width and the final norm
        taken from the tensors present."""
        def get(key, default=None):
            v = meta.get("seqflow." + key)
            if v is None:
                if default is None:
                    raise ValueError(f"seqflow model: metadata key seqflow.{key} is missing")
                return default
            return v

        w1 = tensors.get("blocks.0.mlp.w1.weight")
        return cls(dim=int(get("dim")), heads=int(get("heads")), head_dim=int(get("head_dim")),
                   vocab=int(get("vocab", str(tensors["embed.weight"].shape[0]))),
                   layers=int(get("layers")), segment=int(get("segment")),
                   branches=parse_branches(get("branches")), causal=int(get("causal", "1")) != 0,
                   memory=get("memory", "delta"), global_tokens=int(get("global_tokens", "0")),
                   summary_tokens=int(get("summary_tokens", "0")),
                   norm_eps=float(get("norm_eps", "1e-6")),
                   mlp_hidden=int(w1.shape[0]) if w1 is not None else 0,
                   final_norm="final_norm.weight" in tensors)


def parse_branches(text):
    """"64:1,128:2" -> [(64, 1), (128, 2)]; ValueError on bad syntax."""
    try:
        return [tuple(int(x) for x in b.split(":")) for b in text.split(",")]
    except ValueError:
        raise ValueError(f"seqflow config: branches {text!r}: expected 'window:dilation,...'") from None


class SeqflowState:
    """What a batch of streams carries from segment to segment: per layer the memory M
    [B, H, d, d] and z [B, H, d], and the global keys and values [B, g, H*d] (g <= G)."""

    def __init__(self, M, z, gk, gv, position=0, ended=False):
        self.M, self.z, self.gk, self.gv = M, z, gk, gv
        self.position = position  # tokens consumed so far (a multiple of N unless ended)
        self.ended = ended        # a partial segment was committed: the streams have ended

    def detach(self):
        """The same state without its autograd history (truncated BPTT)."""
        d = lambda ts: [t.detach() for t in ts]
        return SeqflowState(d(self.M), d(self.z), d(self.gk), d(self.gv), self.position, self.ended)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Projections and the per-head gate: attn.q/k/v/o.weight and attn.gate of SPEC 6."""

    def __init__(self, c):
        super().__init__()
        W = c.heads * c.head_dim
        self.q = nn.Linear(c.dim, W, bias=False)
        self.k = nn.Linear(c.dim, W, bias=False)
        self.v = nn.Linear(c.dim, W, bias=False)
        self.o = nn.Linear(W, c.dim, bias=False)
        self.gate = nn.Parameter(torch.zeros(c.heads))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.mlp_hidden, bias=False)
        self.w3 = nn.Linear(c.dim, c.mlp_hidden, bias=False)
        self.w2 = nn.Linear(c.mlp_hidden, c.dim, bias=False)

    def forward(self, u):
        return self.w2(F.silu(self.w1(u)) * self.w3(u))


def _sigma(x):
    return F.elu(x) + 1.0


def _safe_div(num, den):
    """num / den, and 0 where den == 0 (SPEC 4), without a division by zero in the backward."""
    zero = den == 0
    return torch.where(zero, torch.zeros_like(num), num / torch.where(zero, torch.ones_like(den), den))


def _attend(q, k, v, scale, allow):
    """Softmax attention with its log-sum-exp: q [..., Lq, d], k, v [..., Lk, d], allow a boolean
    mask broadcastable to [..., Lq, Lk] or None. Returns (out [..., Lq, d], lse [..., Lq], valid
    [..., Lq]: the row saw at least one key)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if allow is not None:
        s = s.masked_fill(~allow, _MASKED)
    lse = torch.logsumexp(s, -1)
    out = torch.matmul(torch.exp(s - lse[..., None]), v)
    valid = allow.any(-1) if allow is not None else torch.ones(lse.shape, dtype=torch.bool, device=lse.device)
    return out, lse, valid.expand(lse.shape)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.attn = Attention(c)
        if c.mlp_hidden:
            self.mlp_norm = RMSNorm(c.dim, c.norm_eps)
            self.mlp = MLP(c)
        self._index = {}

    def _branch_index(self, w, r, device):
        """Positions of every window that head h uses in branch (w, r): [H, N/w, w/r]."""
        key = (w, r, str(device))
        if key not in self._index:
            N, H = self.c.segment, self.c.heads
            start = torch.arange(0, N, w, device=device)[:, None] + torch.arange(0, w, r, device=device)[None, :]
            pos = start[None] + (torch.arange(H, device=device) % r)[:, None, None]
            self._index[key] = (pos, torch.arange(H, device=device)[:, None, None])
        return self._index[key]

    def local_attention(self, q, k, v, n, gk, gv):
        """A_dot (SPEC 3 and 5) of a segment's n rows: q, k, v [B, n, H, d]; gk, gv [B, g, H*d]."""
        c = self.c
        B, N, H, d = q.shape[0], c.segment, c.heads, c.head_dim
        scale = 1.0 / math.sqrt(d)
        dev = q.device
        if n < N:  # a partial segment is the full one with only its first n positions present
            pad = lambda t: torch.cat([t, t.new_zeros(B, N - n, H, d)], 1)
            q, k, v = pad(q), pad(k), pad(v)
        outs, lses, valids = [], [], []
        for w, r in c.branches:
            pos, hidx = self._branch_index(w, r, dev)
            m = w // r
            qb, kb, vb = q[:, pos, hidx], k[:, pos, hidx], v[:, pos, hidx]  # [B, H, N/w, m, d]
            allow = None
            if c.causal:
                allow = torch.ones(m, m, dtype=torch.bool, device=dev).tril()
            if n < N:
                present = (pos < n)[None, :, :, None, :]                   # keys that exist
                allow = present if allow is None else allow & present
            o, lse, valid = _attend(qb, kb, vb, scale, allow)
            full_o = q.new_zeros(B, N, H, d)
            full_l = q.new_full((B, N, H), _MASKED)
            full_v = torch.zeros(B, N, H, dtype=torch.bool, device=dev)
            full_o[:, pos, hidx] = o
            full_l[:, pos, hidx] = lse
            full_v[:, pos, hidx] = valid
            outs.append(full_o)
            lses.append(full_l)
            valids.append(full_v)
        if gk is not None and gk.shape[1] > 0:
            g = gk.shape[1]
            gkh = gk.view(B, g, H, d).transpose(1, 2)                      # [B, H, g, d]
            gvh = gv.view(B, g, H, d).transpose(1, 2)
            o, lse, valid = _attend(q.transpose(1, 2), gkh, gvh, scale, None)  # [B, H, N, d]
            outs.append(o.transpose(1, 2))
            lses.append(lse.transpose(1, 2))
            valids.append(valid.transpose(1, 2))
        valid = torch.stack(valids)                                         # [P, B, N, H]
        lse = torch.where(valid, torch.stack(lses), torch.full_like(valid, _MASKED, dtype=q.dtype))
        weight = torch.softmax(lse, 0) * valid                              # the LSE merge
        a = (weight[..., None] * torch.stack(outs)).sum(0)                  # [B, N, H, d]
        a = a * valid.any(0)[..., None]            # a query that attends nothing gets 0
        return a[:, :n]

    def forward(self, x, M, z, gk, gv, commit):
        """One segment x [B, n, D] with the layer's state; returns (x, M, z, gk, gv), the state
        advanced when commit (a completed segment or the end of the streams)."""
        c = self.c
        B, n = x.shape[0], x.shape[1]
        H, d, W = c.heads, c.head_dim, c.heads * c.head_dim
        u = self.attn_norm(x)
        q = self.attn.q(u).view(B, n, H, d)
        k = self.attn.k(u).view(B, n, H, d)
        v = self.attn.v(u).view(B, n, H, d)
        a = self.local_attention(q, k, v, n, gk, gv)                        # [B, n, H, d]
        if c.memory != "none":
            sq = _sigma(q.transpose(1, 2))                                  # [B, H, n, d]
            mem = _safe_div(torch.matmul(sq, M), torch.matmul(sq, z[..., None]))
            g = torch.sigmoid(self.attn.gate)[None, None, :, None]
            a = g * mem.transpose(1, 2) + (1 - g) * a
        x = x + self.attn.o(a.reshape(B, n, W))
        if c.mlp_hidden:
            x = x + self.mlp(self.mlp_norm(x))
        if not commit:
            return x, M, z, gk, gv
        if c.memory != "none":
            sk = _sigma(k.transpose(1, 2))                                  # [B, H, n, d]
            target = v.transpose(1, 2)
            if c.memory == "delta":
                target = target - _safe_div(torch.matmul(sk, M), torch.matmul(sk, z[..., None]))
            M = M + torch.matmul(sk.transpose(-1, -2), target)
            z = z + sk.sum(2)
        G, S, N = c.global_tokens, c.summary_tokens, c.segment
        if G > 0 and S > 0:
            kk, vv = k.reshape(B, n, W), v.reshape(B, n, W)
            chunks = [(j * N // S, min((j + 1) * N // S, n)) for j in range(S)]
            chunks = [(lo, hi) for lo, hi in chunks if lo < hi]
            sk_ = torch.stack([kk[:, lo:hi].mean(1) for lo, hi in chunks], 1)
            sv_ = torch.stack([vv[:, lo:hi].mean(1) for lo, hi in chunks], 1)
            gk = torch.cat([gk, sk_], 1)[:, -G:]
            gv = torch.cat([gv, sv_], 1)[:, -G:]
        return x, M, z, gk, gv


class SeqflowModel(nn.Module):
    """The seqflow model. `forward(tokens, state)` returns the hidden states of the tokens
    ([B, T, D], what `seqflow run -o` writes) and the state after them."""

    def __init__(self, config: Optional[SeqflowConfig] = None, **kwargs):
        super().__init__()
        c = config if config is not None else SeqflowConfig(**kwargs)
        if config is not None and kwargs:
            raise TypeError("SeqflowModel: pass a config or keyword arguments, not both")
        c.validate()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        if c.final_norm:
            self.final_norm = RMSNorm(c.dim, c.norm_eps)
        self.reset_parameters()

    def reset_parameters(self, std=0.02):
        """Normal weights of variance 1/fan-in (the embedding 1/D, so that the tied output head
        starts near uniform), unit norms and zero gates (memory and local attention mixed half
        and half)."""
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("attn.gate"):
                    p.zero_()
                elif name == "embed.weight":
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
                else:
                    p.normal_(0.0, std if p.dim() < 2 else 1.0 / math.sqrt(p.shape[1]))

    def init_state(self, batch=1, device=None, dtype=None):
        """The state of `batch` new streams: zero memory, no global tokens."""
        c = self.config
        p = self.embed.weight
        device = device or p.device
        dtype = dtype or p.dtype
        H, d, W = c.heads, c.head_dim, c.heads * c.head_dim
        L = c.layers
        return SeqflowState([torch.zeros(batch, H, d, d, device=device, dtype=dtype) for _ in range(L)],
                            [torch.zeros(batch, H, d, device=device, dtype=dtype) for _ in range(L)],
                            [torch.zeros(batch, 0, W, device=device, dtype=dtype) for _ in range(L)],
                            [torch.zeros(batch, 0, W, device=device, dtype=dtype) for _ in range(L)])

    def forward(self, tokens, state: Optional[SeqflowState] = None, detach: bool = False):
        """tokens: int [T] or [B, T] (B streams of equal length). Segments of N tokens are
        computed in turn; a trailing partial segment is the end of the streams (SPEC 1: it
        commits the state, and the state takes no more tokens). detach=True cuts the autograd
        graph between segments. Returns (hidden [B, T, D] or [T, D], state)."""
        squeeze = tokens.dim() == 1
        if squeeze:
            tokens = tokens[None]
        if tokens.dim() != 2:
            raise ValueError(f"SeqflowModel: tokens of shape {tuple(tokens.shape)}; expected [T] or [B, T]")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise TypeError(f"SeqflowModel: tokens must be integers, not {tokens.dtype}")
        c = self.config
        B, T = tokens.shape
        if T and (int(tokens.min()) < 0 or int(tokens.max()) >= c.vocab):
            bad = tokens[(tokens < 0) | (tokens >= c.vocab)][0]
            raise ValueError(f"SeqflowModel: token {int(bad)} is outside the vocabulary of {c.vocab}")
        if state is None:
            state = self.init_state(B)
        elif state.ended and T:
            raise ValueError("SeqflowModel: the state's streams have ended (a partial segment was committed)")
        elif state.M[0].shape[0] != B:
            raise ValueError(f"SeqflowModel: the state holds {state.M[0].shape[0]} streams, tokens {B}")
        M, z, gk, gv = list(state.M), list(state.z), list(state.gk), list(state.gv)
        N = c.segment
        out = []
        for lo in range(0, T, N):
            seg = tokens[:, lo:lo + N]
            x = self.embed(seg)
            for l, blk in enumerate(self.blocks):
                x, M[l], z[l], gk[l], gv[l] = blk(x, M[l], z[l], gk[l], gv[l], commit=True)
                if detach:
                    M[l], z[l], gk[l], gv[l] = M[l].detach(), z[l].detach(), gk[l].detach(), gv[l].detach()
            if c.final_norm:
                x = self.final_norm(x)
            out.append(x)
        hidden = torch.cat(out, 1) if out else self.embed.weight.new_zeros(B, 0, c.dim)
        new = SeqflowState(M, z, gk, gv, state.position + T, state.ended or T % N != 0)
        return (hidden[0] if squeeze else hidden), new

    def logits(self, hidden):
        """Next-token logits through the tied embedding: hidden @ embed.weight^T."""
        return hidden @ self.embed.weight.t()

    def loss(self, tokens, state=None, detach=False):
        """Mean next-token cross entropy over tokens [B, T] (or [T]) with the tied embedding
        as the output head. Returns (loss, state)."""
        hidden, state = self(tokens, state, detach)
        if tokens.dim() == 1:
            tokens, hidden = tokens[None], hidden[None]
        logits = self.logits(hidden[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1).long())
        return loss, state

    # -- files ----------------------------------------------------------------------------------

    def save_pretrained(self, path):
        """Writes the model as one seqflow safetensors file (float32, SPEC 6). path is a file,
        or a directory that receives model.safetensors. Returns the file's path."""
        from safetensors.torch import save_file
        if os.path.isdir(path):
            path = os.path.join(path, MODEL_FILE)
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, os.fspath(path), metadata=self.config.metadata())
        return os.fspath(path)

    @classmethod
    def from_pretrained(cls, path, device=None):
        """Reads a seqflow model file (float32, float16 or bfloat16 tensors; a directory: its
        model.safetensors). Raises ValueError naming a missing or misshapen tensor or key."""
        from safetensors import safe_open
        if os.path.isdir(path):
            path = os.path.join(path, MODEL_FILE)
        tensors = {}
        with safe_open(os.fspath(path), framework="pt") as f:
            meta = f.metadata() or {}
            for k in f.keys():
                tensors[k] = f.get_tensor(k).to(torch.float32)
        if "embed.weight" not in tensors:
            raise ValueError(f"seqflow model {path}: tensor embed.weight is missing")
        model = cls(SeqflowConfig.from_metadata(meta, tensors))
        own = model.state_dict()
        for k in own:
            if k not in tensors:
                raise ValueError(f"seqflow model {path}: tensor {k} is missing")
            if tuple(tensors[k].shape) != tuple(own[k].shape):
                raise ValueError(f"seqflow model {path}: tensor {k} has shape {tuple(tensors[k].shape)}, "
                                 f"expected {tuple(own[k].shape)}")
        extra = sorted(set(tensors) - set(own))
        if extra:
            raise ValueError(f"seqflow model {path}: unknown tensor {extra[0]}")
        model.load_state_dict(tensors)
        return model.to(device) if device is not None else model
