#!/usr/bin/env python3
"""The yardstick of the attention kernel's target: dense causal flash attention on one 2048-token
window, timed with every PyTorch SDPA backend this GPU offers (flash, cuDNN, memory-efficient).

  dense_flash.py [--windows 4] [--window 2048] [--heads 16] [--head-dim 64] [--reps 50]
                 [--json R.json]

The batch is the reference segment cut into windows: 4 windows x 2048 tokens x 16 heads, d = 64,
bf16, causal, the shape bench_attention_variants times as "dense 2048 causal" (seqflow's kernel on
branch 2048:1 alone). Useful FLOPs count each causal (query, key) pair once, as
sf_attention_useful_flops does: 4 d * L (L + 1) / 2 per window and head. Each backend's median
over --reps calls after 5 warm-ups, CUDA events; its output is checked against the math backend
in float32 (relative error), so a backend that runs but computes something else is reported.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], times[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--window", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        raise SystemExit(77)
    torch.manual_seed(1)
    B, H, L, d = a.windows, a.heads, a.window, a.head_dim
    q, k, v = (2 * torch.rand(B, H, L, d, device="cuda", dtype=torch.bfloat16) - 1 for _ in range(3))
    v = v / 2
    flops = 4.0 * d * L * (L + 1) / 2 * B * H
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
          f"cudnn {torch.backends.cudnn.version()}")
    print(f"shape: {B} windows x {H} heads x {L} tokens, d = {d}, bf16, causal; useful GFLOP {flops / 1e9:.2f}")
    print(f"{'backend':<22} {'median ms':>10} {'min ms':>10} {'TFLOP/s':>10} {'rel error':>10}")
    results = []
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                med, best = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.reps)
        except RuntimeError as e:  # the backend is not built in or refuses the shape
            print(f"{name:<22} unavailable: {str(e).splitlines()[0][:90]}")
            continue
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        tf = flops / (med * 1e-3) / 1e12
        print(f"{name:<22} {med:10.3f} {best:10.3f} {tf:10.1f} {rel:10.2e}")
        results.append({"backend": name, "median_ms": med, "min_ms": best, "tflops": tf, "rel_error": rel})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"windows": B, "heads": H, "window": L, "head_dim": d, "useful_flops": flops,
                       "results": results}, f)


if __name__ == "__main__":
    main()
