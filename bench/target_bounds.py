#!/usr/bin/env python3
"""What the "7x PyTorch" targets require, from one benchmark run's own measurements.

The reference model's useful work splits into the dilated attention (A MFLOP a token) and
everything else (products, MLP, memory: the rest). The fastest the pipeline could possibly go
runs the attention at a given rate and every other FLOP at the measured bf16 GEMM rate, with
nothing else costing time (no norms, no embedding, no idle, no copies): an upper bound, not a
forecast. Printed: the attention rate 7x would need with everything else at the GEMM rate, and
the bound for the attention at the 330 TFLOP/s target, at the fastest dense flash
attention measured in the same run, and at seqflow's own kernel rate.

usage: target_bounds.py --gemm TFLOPS --mflop M --attention-mflop A --peer-tps T
                        [--attention-rate NAME=TFLOPS ...]
                        [--kernel-ms K --peer-attention-ms P --attention-gflop G]
                        [--link-gbs L --output-bytes B --link-peer-tps T2 [--link-model NAME]]

With --link-gbs it also bounds a model whose output download is its limit (the attention-only
model): no faster than the link carries its output.
"""
import argparse


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gemm", type=float, required=True, help="measured bf16 GEMM rate, TFLOP/s")
    p.add_argument("--mflop", type=float, required=True, help="useful MFLOP a token of the whole model")
    p.add_argument("--attention-mflop", type=float, required=True, help="of which the dilated attention's")
    p.add_argument("--peer-tps", type=float, required=True, help="the PyTorch peer's tokens/s on the model")
    p.add_argument("--attention-rate", action="append", default=[], metavar="NAME=TFLOPS",
                   help="an attention rate to bound with (repeatable)")
    p.add_argument("--kernel-ms", type=float, help="seqflow's attention kernel, ms a call (reference shape)")
    p.add_argument("--peer-attention-ms", type=float, help="the peer's attention, ms a call (same inputs)")
    p.add_argument("--attention-gflop", type=float, help="useful GFLOP of that call")
    p.add_argument("--link-gbs", type=float, help="measured device-to-host rate, GB/s (bench_cuda_link)")
    p.add_argument("--output-bytes", type=float, help="bytes of output a token that cross the link")
    p.add_argument("--link-peer-tps", type=float, help="the peer's tokens/s on the model the link bound is for")
    p.add_argument("--link-model", default="attention-only", help="that model's name, for the printout")
    p.add_argument("--factor", type=float, default=7.0)
    a = p.parse_args()
    if not (0 < a.attention_mflop < a.mflop):
        raise SystemExit("target_bounds: --attention-mflop must lie between 0 and --mflop")

    need_tps = a.factor * a.peer_tps
    need_tflops = need_tps * a.mflop * 1e6 / 1e12
    print("bound: %gx the peer (%.0f tokens/s) on the reference model = %.0f tokens/s = %.1f useful TFLOP/s = %.1f%% "
          "of the GEMM rate (%.1f); the attention is %.1f%% of the model's FLOPs"
          % (a.factor, a.peer_tps, need_tps, need_tflops, 100 * need_tflops / a.gemm, a.gemm,
             100 * a.attention_mflop / a.mflop))
    rest = a.mflop - a.attention_mflop
    spare = 1.0 / need_tps - rest * 1e6 / (a.gemm * 1e12)  # seconds a token left for the attention
    if spare > 0:
        print("bound: %gx needs the attention at >= %.1f useful TFLOP/s even with every other FLOP at the GEMM rate"
              % (a.factor, a.attention_mflop * 1e6 / spare / 1e12))
    else:
        print("bound: %gx is out of reach even with the attention free: the other FLOPs alone at the GEMM rate "
              "take longer" % a.factor)
    for item in [("target", 330.0)] + [(n, float(v)) for n, v in (x.split("=", 1) for x in a.attention_rate)]:
        name, rate = item
        seconds = a.attention_mflop * 1e6 / (rate * 1e12) + rest * 1e6 / (a.gemm * 1e12)
        tps = 1.0 / seconds
        print("bound: attention at %.1f TFLOP/s (%s), every other FLOP at the GEMM rate: at most %.0f tokens/s = "
              "%.1f%% of GEMM = %.2fx the peer" % (rate, name, tps, 100 * tps * a.mflop * 1e6 / 1e12 / a.gemm,
                                                   tps / a.peer_tps))
    if a.kernel_ms and a.peer_attention_ms and a.attention_gflop:
        need_ms = a.peer_attention_ms / a.factor
        print("bound: the attention kernel at %gx the peer's attention (%.3f ms) = %.3f ms = %.1f useful TFLOP/s "
              "(now %.3f ms, %.1f TFLOP/s: %.2fx)"
              % (a.factor, a.peer_attention_ms, need_ms, a.attention_gflop / need_ms, a.kernel_ms,
                 a.attention_gflop / a.kernel_ms, a.peer_attention_ms / a.kernel_ms))
    if a.link_gbs and a.output_bytes and a.link_peer_tps:
        tps = a.link_gbs * 1e9 / a.output_bytes
        print("bound: %s, its output (%.0f bytes a token) over the link at %.1f GB/s: at most %.0f tokens/s = %.2fx "
              "the peer (%.0f)" % (a.link_model, a.output_bytes, a.link_gbs, tps, tps / a.link_peer_tps,
                                   a.link_peer_tps))


if __name__ == "__main__":
    main()
