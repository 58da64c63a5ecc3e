#!/usr/bin/env python3
"""The pictures of bench/RESULTS.md, drawn from the data behind it (bench/plots/*.csv):

  docs/throughput_segment.svg  tokens/s against segment length N, seqflow beside the PyTorch
                               peer (bench/peers/seqflow_torch.py), on the GPU and on the CPU
  docs/stream_1b.svg           a stream of one billion tokens on the GPU: tokens/s and memory
                               (the backend's peak, the whole device's use, the process's
                               resident memory) against the tokens streamed

  python3 bench/plot.py [--data bench/plots] [--out docs]

Needs matplotlib (pip install matplotlib). The data come from bench/plot_data_gpu.sh (sweep,
memory) and bench/plot_data_cpu.sh; RESULTS.md says which machine, when and with what command.
"""
import argparse
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "plots"))
p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs"))
a = p.parse_args()


def rows(name):
    with open(os.path.join(a.data, name)) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


plt.rcParams.update({"font.size": 9, "svg.hashsalt": "seqflow", "figure.dpi": 100})

# throughput against N
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
for ax, name, title, unit, scale in (
        (axes[0], "gpu_n.csv", "H100, reference model shape (D=1024, 4 layers), bf16", "million tokens/s", 1e6),
        (axes[1], "cpu_n.csv", "2-core VM, built-in model shape (D=128, 2 layers), f32", "thousand tokens/s", 1e3)):
    r = rows(name)
    n = [x["n"] for x in r]
    ax.plot(n, [x["seqflow_tokens_per_s"] / scale for x in r], "o-", label="seqflow")
    ax.plot(n, [x["pytorch_tokens_per_s"] / scale for x in r], "s--", label="PyTorch peer (eager)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(int(v)) for v in n])
    ax.set_xlabel("segment length N (tokens)")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(a.out, "throughput_segment.svg"), metadata={"Date": None})

# one billion tokens
r = rows("gpu_memory.csv")
t = [x["tokens"] / 1e9 for x in r]
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
axes[0].plot(t, [x["tokens_per_s"] / 1e6 for x in r], "-", label="seqflow (since the start)")
peer = rows("gpu_n.csv")
peer8192 = [x["pytorch_tokens_per_s"] for x in peer if x["n"] == 8192]
if peer8192:
    axes[0].axhline(peer8192[0] / 1e6, ls="--", color="C1", label="PyTorch peer, steady (16 segments)")
axes[0].set_xlabel("tokens streamed (billions)")
axes[0].set_ylabel("million tokens/s")
axes[0].set_ylim(bottom=0)
axes[0].set_title("H100, reference model (N=8192, D=1024, 4 layers), one stream", fontsize=8)
axes[0].legend(fontsize=8)
axes[0].grid(alpha=0.3)
for key, label in (("device_used_mib", "whole device in use"), ("backend_peak_mib", "seqflow backend, peak"),
                   ("rss_mib", "process resident (host)")):
    axes[1].plot(t, [x[key] for x in r], "-", label=label)
axes[1].set_xlabel("tokens streamed (billions)")
axes[1].set_ylabel("MiB")
axes[1].set_ylim(bottom=0)
axes[1].set_title("memory stays flat", fontsize=8)
axes[1].legend(fontsize=8)
axes[1].grid(alpha=0.3)
fig.tight_layout()
fig.savefig(os.path.join(a.out, "stream_1b.svg"), metadata={"Date": None})
print("wrote", os.path.join(a.out, "throughput_segment.svg"), "and", os.path.join(a.out, "stream_1b.svg"))
