#!/usr/bin/env python3
"""Sums `ncu --metrics gpu__time_duration.sum --csv` output per kernel name.

usage: ncu_summary.py NCU_CSV SEGMENTS [SKIP]
Prints each kernel's total device time divided by SEGMENTS - SKIP (ms per segment), largest
first, and the sum. SKIP > 0 leaves out every kernel launched before the (SKIP+1)-th
embed_kernel (one a segment), so the one-off work of the first segments (weight conversions,
the products' first-use algorithm timing) does not count; with SKIP = 0 it does."""
import csv
import sys
from collections import defaultdict


def main():
    path, segments = sys.argv[1], float(sys.argv[2])
    skip = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    embeds = 0
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    total = defaultdict(float)
    calls = defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"]
        short = name.split("(")[0][:90]
        if short == "embed_kernel":
            embeds += 1
        if embeds <= skip:
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6)
        total[short] += value * scale
        calls[short] += 1
    segments -= skip
    grand = sum(total.values())
    print(f"{'kernel':92s} {'calls':>6s} {'ms/segment':>11s} {'share':>7s}")
    for name, ms in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{name:92s} {calls[name]:6d} {ms / segments:11.3f} {100 * ms / grand:6.1f}%")
    print(f"{'total':92s} {'':6s} {grand / segments:11.3f}")


if __name__ == "__main__":
    main()
