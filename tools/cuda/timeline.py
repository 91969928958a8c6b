#!/usr/bin/env python3
"""Where a replayed decode step's time goes, from a kernel timeline (tools/cuda/timeline/
cupti_timeline.cpp's CSV: every kernel's start and end as the GPU ran it, graph nodes included).

A replay of the step's graph is the run of graph kernels up to the first node id seen again (a
replay's nodes run on streams of the graph's own, so streams say nothing). Each moment of a
replay's span is shared evenly by the kernels running then (a kernel overlapping its predecessor
under programmatic dependent launch, or the MoE shared expert's branch); a moment with none
running goes to the kernel that starts next: the shares sum to the span. Medians over the
replays of the graph replayed most.

  python3 tools/cuda/timeline.py TIMELINE.csv [--skip N] [--layers N]
"""
import argparse
import collections
import csv
import re
import statistics


def short(name, width):
    if name.endswith(")"):  # the parameter list
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = name.replace("qwenrt::ops::cuda::", "").replace("(anonymous namespace)::", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=8, help="replays left out at the start")
    ap.add_argument("--layers", type=int, default=0, help="list the first N main-stream kernels of a replay in order (0: 60)")
    ap.add_argument("--width", type=int, default=110)
    ap.add_argument("--eager", action="store_true",
                    help="kernels outside graphs instead (steps of more rows than a graph takes): "
                         "each kernel name's summed time and count")
    ap.add_argument("--graph", choices=["most", "last"], default="most",
                    help="the graph replayed most, or the one whose replays start last (the last "
                         "figure a bench timed: its aggregate decode with -b)")
    args = ap.parse_args()

    rows = []
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), int(r["graph_id"]),
                         int(r["graph_node_id"]), int(r["grid"]), int(r["block"]), r["name"]))
    rows.sort()

    if args.eager:
        eager = [r for r in rows if r[3] == 0]
        if not eager:
            print("no kernels outside graphs in", args.csv)
            return
        span = max(r[1] for r in eager) - min(r[0] for r in eager)
        by = collections.defaultdict(lambda: [0, 0])
        for r in eager:
            by[r[7]][0] += 1
            by[r[7]][1] += r[1] - r[0]
        busy = sum(v[1] for v in by.values())
        print(f"{len(eager)} kernels outside graphs over {span / 1e6:.1f} ms, "
              f"{busy / 1e6:.1f} ms of kernel time")
        print(f"\n{'kernel':<{args.width}} {'n':>6} {'ms':>9} {'%':>6} {'us each':>8}")
        for name, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:40]:
            print(f"{short(name, args.width):<{args.width}} {n:>6} {t / 1e6:>9.2f} "
                  f"{100 * t / busy:>5.1f}% {t / n / 1e3:>8.1f}")
        return

    # Replays: per graph id, split at a node id seen again.
    replays = collections.defaultdict(list)  # graph id -> list of replays (lists of rows)
    current = {}
    seen = {}
    for r in rows:
        g = r[3]
        if g == 0:
            continue
        if g not in current or r[4] in seen[g]:
            if g in current:
                replays[g].append(current[g])
            current[g] = []
            seen[g] = set()
        current[g].append(r)
        seen[g].add(r[4])
    for g, rep in current.items():
        replays[g].append(rep)
    if not replays:
        print("no graph replays in", args.csv)
        return
    if args.graph == "last":
        g = max(replays, key=lambda k: min(r[0] for r in replays[k][0]))
    else:
        g = max(replays, key=lambda k: len(replays[k]))
    reps = replays[g][args.skip:] or replays[g]
    print(f"graph {g}: {len(replays[g])} replays, {len(reps)} used, {len(reps[0])} kernels a replay")

    spans = [max(r[1] for r in rep) - min(r[0] for r in rep) for rep in reps]
    starts = sorted(min(r[0] for r in rep) for rep in reps)
    period = [b - a for a, b in zip(starts, starts[1:])]
    span_us = statistics.median(spans) / 1e3
    print(f"replay span (first start to last end): median {span_us:.1f} us")
    if period:
        print(f"replay start to next replay start: median {statistics.median(period) / 1e3:.1f} us "
              f"(the rest is sampling and the host between replays)")

    # Shares: each moment of the replay's span goes to the kernels running then, split evenly
    # (overlapping kernels of a programmatic dependent launch or of the side stream share it);
    # a moment with none running goes to the kernel that starts next (the gap before it).
    per_pos = collections.defaultdict(lambda: ([], [], [], None))
    for rep in reps:
        rep = sorted(rep)
        share = [0.0] * len(rep)
        events = sorted({t for r in rep for t in (r[0], r[1])})
        for a, b in zip(events, events[1:]):
            running = [i for i, r in enumerate(rep) if r[0] <= a and r[1] >= b]
            if running:
                for i in running:
                    share[i] += (b - a) / len(running)
            else:
                nxt = min((i for i, r in enumerate(rep) if r[0] >= b), key=lambda i: rep[i][0])
                share[nxt] += b - a
        prev_end = None
        for i, r in enumerate(rep):
            d, sh, gaps, _ = per_pos[i]
            d.append(r[1] - r[0])
            sh.append(share[i])
            gaps.append(r[0] - prev_end if prev_end is not None else 0)
            per_pos[i] = (d, sh, gaps, (r[7], r[5], r[6]))
            prev_end = r[1] if prev_end is None else max(prev_end, r[1])

    by_name = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for i, (d, sh, _, info) in per_pos.items():
        e = by_name[info[0]]
        e[0] += 1
        e[1] += statistics.median(d)
        e[2] += statistics.median(sh)
    total_share = sum(v[2] for v in by_name.values())
    print(f"\nshares (medians a position) sum to {total_share / 1e3:.1f} us")
    print(f"\n{'kernel':<{args.width}} {'n':>4} {'own us':>8} {'share us':>9} {'share %':>7}")
    for name, (n, d, sh) in sorted(by_name.items(), key=lambda kv: -kv[1][2]):
        print(f"{short(name, args.width):<{args.width}} {n:>4} {d / 1e3:>8.1f} {sh / 1e3:>9.1f} "
              f"{100 * sh / total_share:>6.1f}%")

    limit = args.layers or 60
    print(f"\nthe first {limit} kernels of a replay by start (medians): own us, share us, "
          f"start - latest earlier end (us; < 0: overlapped), grid x block")
    for i in range(min(limit, len(per_pos))):
        d, s, gaps, info = per_pos[i]
        print(f"{i:>4} {statistics.median(d) / 1e3:>7.2f} {statistics.median(s) / 1e3:>7.2f} "
              f"{statistics.median(gaps) / 1e3:>7.2f}  {info[1]:>5}x{info[2]:<4} {short(info[0], args.width)}")


if __name__ == "__main__":
    main()
