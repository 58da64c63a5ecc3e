#!/usr/bin/env python3
"""A model of sequence parallelism's scaling to many ranks, from measured times and the bytes
the exchange moves, against ring attention's communication volume for the same stream.

  bench/seq_scaling_model.py [--seg-layer-ms T] [--scan-overhead F] [--chunk K] ...

Defaults are the built-in model (D=128, H=4, d=32, N=256, G=16, 4 layers, delta memory) as
measured on the 2-core development VM (bench/RESULTS.md, "Sequence parallelism"). Assumptions
(stated in the output): every rank as fast as the measured core; one datacenter (gateway =
rank 0, a star: the gateway takes R-1 messages in and sends 2(R-1) out per exchange, its link
the bottleneck) or a binary tree (2 log2 R hops of one message each, as a tree of gateways
would do; not built yet); two exchanges per layer (delta rule); no overlap of computing and
exchanging (the exchange adds to each layer's time).
"""
import argparse
import math

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--seg-layer-ms", type=float, default=6.14, help="one segment through one layer on one core (ms)")
p.add_argument("--scan-overhead", type=float, default=1.12, help="scan compute / plain compute")
p.add_argument("--chunk", type=int, default=16, help="segments per rank per round")
p.add_argument("--layers", type=int, default=4)
p.add_argument("--N", type=int, default=256, help="segment length")
p.add_argument("--heads", type=int, default=4)
p.add_argument("--d", type=int, default=32)
p.add_argument("--G", type=int, default=16, help="global tokens")
p.add_argument("--gbit", type=float, default=10.0, help="link rate inside a datacenter (Gbit/s)")
p.add_argument("--latency-us", type=float, default=50.0, help="one-way latency inside a datacenter (us)")
a = p.parse_args()

W = a.heads * a.d
msg1 = 16 + 4 * a.heads * a.d + 2 * a.G * W * 4  # z sum and the last G summary tokens (k and v)
msg2 = 16 + 2 * 4 * a.heads * a.d * a.d          # A and B, float32
per_layer_msg = msg1 + msg2
bw = a.gbit * 1e9 / 8
lat = a.latency_us * 1e-6
compute = a.chunk * a.seg_layer_ms * 1e-3 * a.scan_overhead  # one layer of one chunk
tokens_per_rank_round = a.chunk * a.N

print(f"assumptions: {a.gbit:g} Gbit/s and {a.latency_us:g} us one way inside a datacenter; chunks of {a.chunk} "
      f"segments of {a.N}; a layer of a chunk computes in {compute * 1e3:.1f} ms (measured {a.seg_layer_ms} ms a "
      f"segment-layer x {a.scan_overhead} for the scan); messages {msg1} + {msg2} bytes a rank a layer")
print(f"| ranks | star: exchange ms/layer | star efficiency | tree: exchange ms/layer | tree efficiency | "
      f"scan bytes/token (all ranks) | ring attention bytes/token |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for R in (2, 8, 64, 512):
    # star: each exchange = members' messages into the gateway, prefix and total back out
    star = 0.0
    for m in (msg1, msg2):
        star += 2 * lat + (R - 1) * m / bw + 2 * (R - 1) * m / bw
    tree = 0.0
    for m in (msg1, msg2):
        tree += 2 * math.ceil(math.log2(R)) * (lat + m / bw)
    eff_star = compute / (compute + star)
    eff_tree = compute / (compute + tree)
    # bytes: every rank sends its message up and gets prefix and total back: 3 messages a rank a layer
    scan_bytes = 3 * per_layer_msg * a.layers / tokens_per_rank_round
    # ring attention: every rank's K and V (float32) pass every other rank, each layer
    ring = (R - 1) * 2 * W * 4 * a.layers
    print(f"| {R} | {star * 1e3:.2f} | {eff_star * 100:.1f} % | {tree * 1e3:.2f} | {eff_tree * 100:.1f} % | "
          f"{scan_bytes:.1f} | {ring:,} |")
