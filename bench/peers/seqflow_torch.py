#!/usr/bin/env python3
"""The SPEC model (docs/SPEC.md sections 2-6) written the way a PyTorch user would write it:
eager mode, per branch a gather of the active rows of every window and one flash-attention call
that also returns the log-sum-exp, the branches and the global tokens merged by their LSE, bmm
for the compressive memory, cuBLAS products in bf16. It is seqflow's peer in the GPU benchmark
(bench/gpu_bench.sh): same model file, same tokens, outputs compared, both timed.

  seqflow_torch.py run --model M.safetensors --tokens T.u32 [--out H.npy] [--device cuda]
                       [--precision bf16|f32] [--out-dtype f32|bf16] [--warmup-segments 2] [--json R.json]
  seqflow_torch.py compare A.npy B.npy [--rows N] [--tol 2e-2]
  seqflow_torch.py attention --inputs DIR [--reps 50] [--json R.json]

`run` processes the stream segment by segment with the state carried (memory M/z and the
global-token FIFO of every layer), a final partial segment included, and times the segments
after the warm-up with CUDA events. `attention` times the attention alone (local_attention: the
branches, the global tokens, the merge) on the inputs that bench_attention_variants writes with
ATT_DUMP=DIR, and checks it against the fused kernel's output there. Model files are read with numpy alone (no safetensors
package needed): float32, float16 and bfloat16 tensors.
"""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np


# ---------------------------------------------------------------------------------------------
# Model file (SPEC 6)

def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + hlen
    tensors = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        buf = raw[base + lo:base + hi]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"seqflow_torch: tensor {name}: unsupported dtype {dt}")
        tensors[name] = a.reshape(info["shape"]).copy()
    return meta, tensors


def parse_config(meta, tensors):
    def get(key, default=None):
        v = meta.get("seqflow." + key)
        if v is None:
            if default is None:
                raise SystemExit(f"seqflow_torch: model lacks metadata seqflow.{key}")
            return default
        return v

    cfg = {
        "dim": int(get("dim")), "heads": int(get("heads")), "head_dim": int(get("head_dim")),
        "layers": int(get("layers")), "segment": int(get("segment")),
        "branches": [tuple(int(x) for x in b.split(":")) for b in get("branches").split(",")],
        "causal": int(get("causal", "1")) != 0, "memory": get("memory", "delta"),
        "global_tokens": int(get("global_tokens", "0")), "summary_tokens": int(get("summary_tokens", "0")),
        "norm_eps": float(get("norm_eps", "1e-6")),
    }
    cfg["mlp"] = "blocks.0.mlp.w1.weight" in tensors
    cfg["final_norm"] = "final_norm.weight" in tensors
    return cfg


# ---------------------------------------------------------------------------------------------
# The model

class SeqflowTorch:
    def __init__(self, cfg, tensors, device, precision):
        self._runtime(cfg, device, precision)
        torch, f32 = self.torch, self.torch.float32

        def t(name, dtype):
            return torch.from_numpy(tensors[name]).to(self.dev, dtype)

        self.embed = t("embed.weight", f32)
        self.final_norm = t("final_norm.weight", f32) if cfg["final_norm"] else None
        self.blocks = []
        for l in range(cfg["layers"]):
            p = f"blocks.{l}."
            b = {
                "attn_norm": t(p + "attn_norm.weight", f32),
                # Q, K and V in one product, as fused-QKV implementations do
                "wqkv": torch.cat([t(p + "attn.q.weight", self.dtype), t(p + "attn.k.weight", self.dtype),
                                   t(p + "attn.v.weight", self.dtype)], 0),
                "wo": t(p + "attn.o.weight", self.dtype),
                "gate": torch.sigmoid(t(p + "attn.gate", f32)),
            }
            if cfg["mlp"]:
                b["mlp_norm"] = t(p + "mlp_norm.weight", f32)
                b["w13"] = torch.cat([t(p + "mlp.w1.weight", self.dtype), t(p + "mlp.w3.weight", self.dtype)], 0)
                b["w2"] = t(p + "mlp.w2.weight", self.dtype)
            self.blocks.append(b)
        self.reset()

    def _runtime(self, cfg, device, precision):
        import torch
        self.torch = torch
        self.cfg = cfg
        self.dev = torch.device(device)
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # The flash kernel takes only half-precision inputs; float32 (the checking mode) computes
        # the same thing explicitly.
        self.flash = self.dtype == torch.bfloat16 and self.dev.type == "cuda"
        self.index_cache = {}

    @classmethod
    def attention_only(cls, cfg, device, precision, gk, gv):
        """An object that has only what local_attention needs (layer 0's global keys and values
        gk, gv: [G, H*d] float32): the attention timed alone (`attention` command)."""
        m = cls.__new__(cls)
        m._runtime(cfg, device, precision)
        m.gk, m.gv = [gk], [gv]
        return m

    def reset(self):
        torch, c = self.torch, self.cfg
        H, d, W = c["heads"], c["head_dim"], c["heads"] * c["head_dim"]
        self.M = [torch.zeros(H, d, d, device=self.dev) for _ in range(c["layers"])]
        self.z = [torch.zeros(H, d, device=self.dev) for _ in range(c["layers"])]
        self.gk = [torch.zeros(0, W, device=self.dev) for _ in range(c["layers"])]
        self.gv = [torch.zeros(0, W, device=self.dev) for _ in range(c["layers"])]

    # -- helpers ------------------------------------------------------------------------------

    def rmsnorm(self, x, w):
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["norm_eps"]) * w

    def branch_index(self, w, r):
        """Rows of every window that head h uses in branch (w, r): [H, N/w, w/r] positions."""
        key = (w, r)
        if key not in self.index_cache:
            torch, N, H = self.torch, self.cfg["segment"], self.cfg["heads"]
            start = torch.arange(0, N, w, device=self.dev)[:, None] + torch.arange(0, w, r, device=self.dev)[None, :]
            pos = start[None] + (torch.arange(H, device=self.dev) % r)[:, None, None]
            self.index_cache[key] = (pos, torch.arange(H, device=self.dev)[:, None, None])
        return self.index_cache[key]

    def attend(self, q, k, v, causal, key_valid=None):
        """Softmax attention with its log-sum-exp. q, k, v: [B, h, L, d]. Returns (out float32
        [B, h, Lq, d], lse float32 [B, h, Lq]); lse is -inf for a row that sees no key."""
        torch = self.torch
        scale = 1.0 / math.sqrt(self.cfg["head_dim"])
        if self.flash and key_valid is None:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
            return out.float(), lse.float()
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        Lq, Lk = s.shape[-2], s.shape[-1]
        allow = torch.ones(Lq, Lk, dtype=torch.bool, device=s.device)
        if causal:
            allow = torch.tril(allow)
        if key_valid is not None:
            allow = allow & key_valid[..., None, :]
        s = s.masked_fill(~allow, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        return torch.matmul(p, v.float()), lse

    def local_attention(self, l, q, k, v, n):
        """A_dot (SPEC 3 and 5) for the n rows of q, k, v ([n, H, d], compute dtype): float32."""
        torch, c = self.torch, self.cfg
        N, H, d = c["segment"], c["heads"], c["head_dim"]
        if n < N:  # a partial segment is the full one with only its first n positions present
            pad = lambda t: torch.cat([t, t.new_zeros(N - n, H, d)], 0)
            q, k, v = pad(q), pad(k), pad(v)
        outs, lses = [], []
        for (w, r) in c["branches"]:
            pos, hidx = self.branch_index(w, r)
            nw, m = N // w, w // r
            qb = q[pos, hidx].reshape(H * nw, 1, m, d)
            kb = k[pos, hidx].reshape(H * nw, 1, m, d)
            vb = v[pos, hidx].reshape(H * nw, 1, m, d)
            valid = None
            if n < N and not c["causal"]:
                valid = (pos < n).reshape(H * nw, 1, m)
            o, lse = self.attend(qb, kb, vb, c["causal"], valid)
            full_o = torch.zeros(N, H, d, device=self.dev)
            full_l = torch.full((N, H), float("-inf"), device=self.dev)
            full_o[pos, hidx] = o.reshape(H, nw, m, d)
            full_l[pos, hidx] = lse.reshape(H, nw, m)
            outs.append(full_o)
            lses.append(full_l)
        if self.gk[l].shape[0] > 0:
            G = self.gk[l].shape[0]
            gk = self.gk[l].to(self.dtype).view(G, H, d).transpose(0, 1)[None]
            gv = self.gv[l].to(self.dtype).view(G, H, d).transpose(0, 1)[None]
            o, lse = self.attend(q.transpose(0, 1)[None].contiguous(), gk.contiguous(), gv.contiguous(), False)
            outs.append(o[0].transpose(0, 1))
            lses.append(lse[0].transpose(0, 1))
        lse = torch.stack(lses)                               # [P, N, H]
        total = torch.logsumexp(lse, 0)                       # -inf where nothing is attended
        weight = torch.exp(lse - total).nan_to_num(0.0)       # [P, N, H]
        a = (weight[..., None] * torch.stack(outs)).sum(0)    # [N, H, d]
        return a[:n]

    def block(self, l, x, n):
        torch, c, b = self.torch, self.cfg, self.blocks[l]
        H, d, W = c["heads"], c["head_dim"], c["heads"] * c["head_dim"]
        u = self.rmsnorm(x, b["attn_norm"]).to(self.dtype)
        qkv = u @ b["wqkv"].t()
        q, k, v = qkv[:, :W].view(n, H, d), qkv[:, W:2 * W].view(n, H, d), qkv[:, 2 * W:].view(n, H, d)
        a = self.local_attention(l, q, k, v, n)                # [n, H, d] float32
        kf = k.float().transpose(0, 1)                         # [H, n, d]
        vf = v.float().transpose(0, 1)
        if c["memory"] != "none":
            sq = torch.nn.functional.elu(q.float().transpose(0, 1)) + 1.0
            num = torch.bmm(sq, self.M[l])                     # [H, n, d]
            den = torch.bmm(sq, self.z[l][:, :, None])         # [H, n, 1]
            mem = torch.where(den == 0, torch.zeros_like(num), num / den)
            g = b["gate"][None, :, None]
            a = g * mem.transpose(0, 1) + (1 - g) * a
        x = x + (a.reshape(n, W).to(self.dtype) @ b["wo"].t()).float()
        if c["mlp"]:
            u2 = self.rmsnorm(x, b["mlp_norm"]).to(self.dtype)
            h13 = u2 @ b["w13"].t()
            F = h13.shape[1] // 2
            h = torch.nn.functional.silu(h13[:, :F]) * h13[:, F:]
            x = x + (h @ b["w2"].t()).float()
        if c["memory"] != "none":
            sk = torch.nn.functional.elu(kf) + 1.0             # [H, n, d]
            target = vf
            if c["memory"] == "delta":
                num = torch.bmm(sk, self.M[l])
                den = torch.bmm(sk, self.z[l][:, :, None])
                target = vf - torch.where(den == 0, torch.zeros_like(num), num / den)
            self.M[l] = self.M[l] + torch.bmm(sk.transpose(1, 2), target)
            self.z[l] = self.z[l] + sk.sum(1)
        G, S, N = c["global_tokens"], c["summary_tokens"], c["segment"]
        if G > 0 and S > 0:
            kk, vv = k.reshape(n, W).float(), v.reshape(n, W).float()
            if n == N and N % S == 0:
                sk_, sv_ = kk.view(S, N // S, W).mean(1), vv.view(S, N // S, W).mean(1)
            else:
                chunks = [(j * N // S, min((j + 1) * N // S, n)) for j in range(S)]
                chunks = [(lo, hi) for lo, hi in chunks if lo < hi]
                sk_ = torch.stack([kk[lo:hi].mean(0) for lo, hi in chunks])
                sv_ = torch.stack([vv[lo:hi].mean(0) for lo, hi in chunks])
            self.gk[l] = torch.cat([self.gk[l], sk_])[-G:]
            self.gv[l] = torch.cat([self.gv[l], sv_])[-G:]
        return x

    def segment(self, tokens):
        """tokens: int64 tensor of n <= N ids on the device. Returns [n, D] float32."""
        n = tokens.shape[0]
        x = self.embed[tokens]
        for l in range(self.cfg["layers"]):
            x = self.block(l, x, n)
        if self.final_norm is not None:
            x = self.rmsnorm(x, self.final_norm)
        return x


# ---------------------------------------------------------------------------------------------
# Commands

def cmd_run(a):
    import torch
    meta, tensors = load_safetensors(a.model)
    cfg = parse_config(meta, tensors)
    tokens = np.fromfile(a.tokens, dtype="<u4").astype(np.int64)
    if a.max_tokens:
        tokens = tokens[:a.max_tokens]
    vocab = tensors["embed.weight"].shape[0]
    if tokens.size and tokens.max() >= vocab:
        raise SystemExit(f"seqflow_torch: token {int(tokens.max())} outside the vocabulary of {vocab}")
    model = SeqflowTorch(cfg, tensors, a.device, a.precision)
    del tensors
    N, D = cfg["segment"], cfg["dim"]
    n_seg = (tokens.size + N - 1) // N
    cuda = model.dev.type == "cuda"
    tok = torch.from_numpy(tokens).to(model.dev)
    # --out-dtype bf16: the hidden states sent out as bf16 (half the bytes), as seqflow's
    # --out-dtype bf16 does; the .npy then holds their bit patterns as uint16
    out_dtype = torch.bfloat16 if a.out_dtype == "bf16" else torch.float32
    out = torch.empty((tokens.size, D), dtype=out_dtype, pin_memory=cuda) if a.out else None
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n_seg + 1)] if cuda else None
    host_t = [0.0] * (n_seg + 1)
    warm = min(a.warmup_segments, max(n_seg - 1, 0))
    with torch.inference_mode():
        for s in range(n_seg):
            if s == warm:
                if cuda:
                    torch.cuda.synchronize()
                    events[s].record()
                host_t[s] = time.perf_counter()
            y = model.segment(tok[s * N:(s + 1) * N])
            if out is not None:
                out[s * N:s * N + y.shape[0]].copy_(y.to(out_dtype), non_blocking=True)
        if cuda:
            events[n_seg].record()
            torch.cuda.synchronize()
        host_t[n_seg] = time.perf_counter()
    timed_tokens = tokens.size - warm * N
    seconds = events[warm].elapsed_time(events[n_seg]) / 1e3 if cuda else host_t[n_seg] - host_t[warm]
    result = {
        "impl": "pytorch", "torch": torch.__version__, "device": a.device,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu", "precision": a.precision, "out_dtype": a.out_dtype,
        "tokens": int(tokens.size), "segments": n_seg, "warmup_segments": warm,
        "timed_tokens": int(timed_tokens), "seconds": seconds,
        "tokens_per_s": timed_tokens / seconds if seconds > 0 else float("nan"),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "flash": model.flash,
    }
    if a.out:
        np.save(a.out, out.view(torch.int16).numpy().view(np.uint16) if a.out_dtype == "bf16" else out.numpy())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print("pytorch peer: %d tokens (%d segments, %d warm-up), %.0f tokens/s steady, peak %.2f GiB allocated, %s %s"
          % (tokens.size, n_seg, warm, result["tokens_per_s"], result["peak_memory_bytes"] / 2**30,
             a.precision, "flash+LSE" if model.flash else "explicit softmax"))


def cmd_compare(a):
    x = np.load(a.a, mmap_mode="r")
    y = np.load(a.b, mmap_mode="r")
    rows = min(x.shape[0], y.shape[0]) if a.rows == 0 else a.rows
    if x.shape[1:] != y.shape[1:] or x.shape[0] < rows or y.shape[0] < rows:
        print(f"compare: shapes differ: {x.shape} vs {y.shape}")
        sys.exit(1)
    num = den = 0.0
    worst = 0.0
    def rows_f64(a, lo):
        c = np.asarray(a[lo:lo + 8192])
        if c.dtype == np.uint16:  # bf16 bit patterns (--out-dtype bf16)
            c = (c.astype(np.uint32) << 16).view(np.float32)
        return c.astype(np.float64)

    for lo in range(0, rows, 8192):
        xa = rows_f64(x, lo)
        ya = rows_f64(y, lo)
        num += float(((xa - ya) ** 2).sum())
        den += float((ya ** 2).sum())
        worst = max(worst, float(np.abs(xa - ya).max()) if xa.size else 0.0)
    finite = bool(np.isfinite(num) and np.isfinite(den))
    rel = math.sqrt(num / den) if den > 0 and finite else float("nan")
    ok = finite and rel <= a.tol
    print("compare %s vs %s: %d rows, rel. error %.3e, max abs %.3e, tol %.1e: %s"
          % (a.a, a.b, rows, rel, worst, a.tol, "PASS" if ok else "FAIL"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"a": a.a, "b": a.b, "rows": rows, "rel_error": rel, "max_abs": worst, "tol": a.tol, "pass": ok}, f)
    sys.exit(0 if ok else 1)


def useful_attention_flops(cfg, n):
    """sf_attention_useful_flops (kernels/cpu/attention.c): 4 d per (query, key) pair that a
    query attends, causal pairs halved, plus every row against the global keys."""
    pairs = 0
    for h in range(cfg["heads"]):
        for (w, r) in cfg["branches"]:
            o = h % r
            for start in range(0, n, w):
                rows = len(range(start + o, min(start + w, n), r))
                pairs += rows * (rows + 1) // 2 if cfg["causal"] else rows * rows
        pairs += n * cfg["global_tokens"]
    return 4.0 * cfg["head_dim"] * pairs


def cmd_attention(a):
    """The peer's local attention (all branches, the global tokens and the LSE merge: what
    seqflow's fused kernel does) on the inputs bench_attention_variants wrote (ATT_DUMP), checked
    against that kernel's output and timed with CUDA events beside its time."""
    import torch
    meta = json.load(open(f"{a.inputs}/attention.json"))
    n, H, d, G = meta["n"], meta["heads"], meta["head_dim"], meta["n_global"]
    W = H * d
    cfg = {"segment": meta["segment"], "heads": H, "head_dim": d, "causal": bool(meta["causal"]),
           "branches": [tuple(b) for b in meta["branches"]], "global_tokens": G}
    dev = torch.device(a.device)

    def rows(name, np_dtype, count):
        x = np.fromfile(f"{a.inputs}/{name}", dtype=np_dtype)
        if x.size != count:
            raise SystemExit(f"seqflow_torch: {a.inputs}/{name}: {x.size} values, expected {count}")
        return x

    def bf16(name):
        return torch.from_numpy(rows(name, "<i2", n * W)).to(dev).view(torch.bfloat16).view(n, H, d)

    q, k, v = bf16("q.bf16"), bf16("k.bf16"), bf16("v.bf16")
    gk = torch.from_numpy(rows("gk.f32", "<f4", G * W).reshape(G, W)).to(dev)
    gv = torch.from_numpy(rows("gv.f32", "<f4", G * W).reshape(G, W)).to(dev)
    want = torch.from_numpy(rows("out.f32", "<f4", n * W).reshape(n, W)).to(dev, torch.float64)
    model = SeqflowTorch.attention_only(cfg, a.device, "bf16", gk, gv)
    flops = useful_attention_flops(cfg, n)
    if abs(flops - meta["useful_flops"]) > 1e-6 * flops:
        raise SystemExit(f"seqflow_torch: useful FLOPs {flops:.0f} differ from the kernel bench's {meta['useful_flops']:.0f}")
    with torch.inference_mode():
        got = model.local_attention(0, q, k, v, n).reshape(n, W).to(torch.float64)
        rel = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(got))
        for _ in range(a.warmup):
            model.local_attention(0, q, k, v, n)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
        for e0, e1 in ev:
            e0.record()
            model.local_attention(0, q, k, v, n)
            e1.record()
        torch.cuda.synchronize()
    ms = sorted(e0.elapsed_time(e1) for e0, e1 in ev)
    peer_ms = ms[len(ms) // 2]
    ok = math.isfinite(rel) and rel <= a.tol
    result = {"peer_ms": peer_ms, "peer_min_ms": ms[0], "peer_tflops": flops / (peer_ms * 1e-3) / 1e12,
              "kernel_ms": meta["kernel_ms"], "kernel_tflops": flops / (meta["kernel_ms"] * 1e-3) / 1e12,
              "speedup": peer_ms / meta["kernel_ms"], "rel_error": rel, "tol": a.tol, "pass": ok,
              "useful_gflop": flops / 1e9, "torch": torch.__version__}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print("attention against the PyTorch peer (n=%d, %d heads, d=%d, branches %s, %s, %d global tokens; %.2f useful "
          "GFLOP): peer %.3f ms (%.1f TFLOP/s), seqflow's kernel %.3f ms (%.1f TFLOP/s): %.2fx"
          % (n, H, d, ",".join("%d:%d" % b for b in cfg["branches"]), "causal" if cfg["causal"] else "non-causal", G,
             flops / 1e9, peer_ms, result["peer_tflops"], meta["kernel_ms"], result["kernel_tflops"], result["speedup"]))
    print("compare attention kernel vs peer: rel. error %.3e, tol %.1e: %s" % (rel, a.tol, "PASS" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the model over a token file, time it, write the hidden states")
    r.add_argument("--model", required=True)
    r.add_argument("--tokens", required=True, help="little-endian uint32 token ids")
    r.add_argument("--out", help="final hidden states, [tokens, D] float32 .npy (uint16 bf16 bits with --out-dtype bf16)")
    r.add_argument("--out-dtype", choices=["f32", "bf16"], default="f32",
                   help="element type of the hidden states brought to the host and written")
    r.add_argument("--device", default="cuda")
    r.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    r.add_argument("--warmup-segments", type=int, default=2)
    r.add_argument("--max-tokens", type=int, default=0)
    r.add_argument("--json", help="write the timing as JSON here")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="relative error ||a-b|| / ||b|| of two [rows, D] .npy files")
    c.add_argument("a")
    c.add_argument("b", help="the reference")
    c.add_argument("--rows", type=int, default=0, help="compare the first ROWS rows (0: all rows both have)")
    c.add_argument("--tol", type=float, default=2e-2)
    c.add_argument("--json")
    c.set_defaults(fn=cmd_compare)
    t = sub.add_parser("attention", help="time the peer's attention alone on the inputs bench_attention_variants dumped")
    t.add_argument("--inputs", required=True, help="the directory ATT_DUMP named")
    t.add_argument("--device", default="cuda")
    t.add_argument("--reps", type=int, default=50)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--tol", type=float, default=2e-2)
    t.add_argument("--json")
    t.set_defaults(fn=cmd_attention)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
