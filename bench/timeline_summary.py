#!/usr/bin/env python3
"""Where a GPU run's wall time goes, from a kernel trace: the CSV of bench/kernel_trace.c
(start,end,stream,name; ns) or an Nsight Systems trace exported to SQLite:

    python3 bench/timeline_summary.py trace.csv|trace.sqlite [--per NAME_SUBSTRING] [--device N]

Over the steady middle of the run (kernel starts between the 20th and the 95th percentile, so
start-up and the last segments fall out): the window's length, how much of it some kernel ran
(the union of all kernels' intervals), the idle gaps between kernels (count and sum by size),
each stream's kernel time, and the top kernels by total time; and, from the CSV, the copies
between host and device (rows named "[memcpy KIND BYTES]") by direction: how long a copy ran a
segment (the union of the copies' intervals), bytes, and the rate while copying. --per names a
kernel that runs once per segment (default: 'embed'), to report everything per segment (a device
that runs none counts the segments by the other devices' in the same window). --device N keeps
the kernels and copies of device N (a CSV with a device column: one process driving several
GPUs); the host calls stay."""
import csv
import re
import sqlite3
import sys
from collections import defaultdict


def short_name(name):
    """A mangled C++ kernel name's identifier (_Z15attention_wgmmaI... -> attention_wgmma)."""
    m = re.match(r"_ZL?(\d+)", name)
    return name[m.end():m.end() + int(m.group(1))] if m else name[:48]


def main():
    path = sys.argv[1]
    per = sys.argv[sys.argv.index("--per") + 1] if "--per" in sys.argv else "embed"
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else None
    copies, apis = [], []
    per_anywhere = []  # starts of the --per kernel on any device: a device without it (a head
                       # rank's other GPU runs no embedding) counts the segments of the others
    if path.endswith(".csv"):
        with open(path) as f:
            every = [(int(r["start"]), int(r["end"]), int(r["stream"]), r["name"], r.get("device") or device)
                     for r in csv.DictReader(f)]
        per_anywhere = sorted(r[0] for r in every if per in r[3] and not r[3].startswith("["))
        rows = sorted(r[:4] for r in every if device is None or r[3].startswith("[api") or r[4] == device)
        copies = [r for r in rows if r[3].startswith("[memcpy")]
        apis = [r for r in rows if r[3].startswith("[api")]
        rows = [r for r in rows if not r[3].startswith("[memcpy") and not r[3].startswith("[api")]
        names = {}
    else:
        db = sqlite3.connect(path)
        names = dict(db.execute("SELECT id, value FROM StringIds"))
        rows = db.execute("SELECT start, end, streamId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    if not rows:
        print("no kernels in the trace")
        return
    starts = [r[0] for r in rows]
    lo, hi = starts[int(0.20 * len(starts))], starts[int(0.95 * len(starts)) - 1]
    ks = [(s, e, st, short_name(names.get(n, str(n)))) for s, e, st, n in rows if lo <= s <= hi]
    window = max(e for _, e, _, _ in ks) - lo
    segments = sum(1 for k in ks if per in k[3]) or sum(1 for t in per_anywhere if lo <= t <= hi) or 1
    busy, gaps, cur_s, cur_e, last = 0, [], None, None, None
    long_gaps = []  # (start, end) of idle gaps of 50 us and more
    gap_at = defaultdict(lambda: [0, 0])  # (kernel that ended last, kernel that starts) -> count, ns
    for s, e, _, n in ks:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append(s - cur_e)
                if s - cur_e >= 50000:
                    long_gaps.append((cur_e, s))
                g = gap_at[(last, n)]
                g[0] += 1
                g[1] += s - cur_e
            cur_s, cur_e, last = s, e, n
        elif e > cur_e:
            cur_e, last = e, n
    busy += cur_e - cur_s
    us = 1e-3
    print(f"window {window * us / 1e3:.2f} ms, {segments} segments ('{per}' kernels), {len(ks)} kernels")
    print(f"per segment: wall {window * us / segments:.1f} us, some kernel running {busy * us / segments:.1f} us "
          f"({100.0 * busy / window:.1f}%), idle {(window - busy) * us / segments:.1f} us")
    edges = [0, 2000, 5000, 20000, 100000, float("inf")]
    for a, b in zip(edges, edges[1:]):
        sel = [g for g in gaps if a <= g < b]
        label = f"{a * us:.0f}-{b * us:.0f} us" if b != float("inf") else f">= {a * us:.0f} us"
        print(f"  gaps {label:>12}: {len(sel) / segments:7.2f} a segment, {sum(sel) * us / segments:8.1f} us a segment")
    print("idle gaps by the kernels around them (count and time a segment):")
    for (a, b), (c, t) in sorted(gap_at.items(), key=lambda x: -x[1][1])[:14]:
        print(f"  {c / segments:5.2f}x {t * us / segments:7.1f} us  {a} -> {b}")
    by_stream = defaultdict(int)
    by_name = defaultdict(lambda: [0, 0])
    for s, e, st, n in ks:
        by_stream[st] += e - s
        by_name[n][0] += e - s
        by_name[n][1] += 1
    for st, t in sorted(by_stream.items(), key=lambda x: -x[1]):
        print(f"stream {st}: kernels {t * us / segments:.1f} us a segment")
    print(f"sum of kernel times {sum(by_stream.values()) * us / segments:.1f} us a segment "
          f"(over the union: {(sum(by_stream.values()) - busy) * us / segments:.1f} us ran beside another)")
    for n, (t, c) in sorted(by_name.items(), key=lambda x: -x[1][0])[:18]:
        print(f"  {t * us / segments:8.1f} us/seg  {c / segments:5.1f}x  {n}")
    # what ran beside what: overlap of kernels on different streams, by the pair of names
    beside = defaultdict(int)
    for i, (s, e, st, n) in enumerate(ks):
        for j in range(i + 1, len(ks)):
            s2, e2, st2, n2 = ks[j]
            if s2 >= e:
                break
            if st2 != st:
                beside[tuple(sorted((n, n2)))] += min(e, e2) - s2
    if beside:
        print("side by side (overlap a segment):")
        for (a, b), t in sorted(beside.items(), key=lambda x: -x[1])[:12]:
            print(f"  {t * us / segments:8.1f} us  {a} | {b}")
    report_copies([c for c in copies if lo <= c[0] <= lo + window], window, segments)
    if apis:
        report_api([a for a in apis if lo <= a[0] <= lo + window], long_gaps, segments)


def report_api(apis, long_gaps, segments):
    """The long host calls a segment by name, and the ones that spanned idle gaps of 50 us and
    more (by how much of those gaps they covered), with the thread that made them."""
    us = 1e-3
    by_name = defaultdict(lambda: [0, 0])
    for s, e, _, name in apis:
        by_name[name][0] += 1
        by_name[name][1] += e - s
    print(f"host runtime calls of {min((e - s for s, e, _, _ in apis), default=0) * us:.0f} us and more "
          f"(SEQFLOW_TRACE_API_US), a segment:")
    for name, (c, t) in sorted(by_name.items(), key=lambda x: -x[1][1])[:10]:
        print(f"  {c / segments:6.2f}x {t * us / segments:9.1f} us  {name}")
    print(f"idle gaps of 50 us and more: {len(long_gaps) / segments:.2f} a segment, "
          f"{sum(e - s for s, e in long_gaps) * us / segments:.1f} us a segment; host calls spanning them:")
    spans = defaultdict(lambda: [0, 0])
    for gs, ge in long_gaps:
        for s, e, thread, name in apis:
            if s < ge and e > gs:
                k = (name, thread)
                spans[k][0] += 1
                spans[k][1] += min(e, ge) - max(s, gs)
    for (name, thread), (c, t) in sorted(spans.items(), key=lambda x: -x[1][1])[:10]:
        print(f"  {c / segments:6.2f}x {t * us / segments:9.1f} us of the gaps  {name} (thread {thread})")


def report_copies(copies, window, segments):
    """Per direction: copies a segment, bytes, the union of their intervals, the rate while copying."""
    us = 1e-3
    by_kind = defaultdict(list)
    for s, e, _, name in copies:
        kind, size = name.strip("[]").split()[1:3]
        by_kind[kind].append((s, e, int(size)))
    for kind, cs in sorted(by_kind.items()):
        busy, cur_s, cur_e = 0, None, None
        for s, e, _ in sorted(cs):
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            elif e > cur_e:
                cur_e = e
        busy += cur_e - cur_s
        nbytes = sum(b for _, _, b in cs)
        print(f"copies {kind}: {len(cs) / segments:.2f} a segment, {nbytes / segments / 2**20:.2f} MiB a segment, "
              f"copying {busy * us / segments:.1f} us a segment ({100.0 * busy / window:.1f}% of the wall), "
              f"{nbytes / busy if busy else 0:.2f} GB/s while copying")


if __name__ == "__main__":
    main()
