"""Per-kernel time of one decode step from `ncu --csv --metrics gpu__time_duration.sum` output.

    python3 tools/cuda/ncu_summary.py ncu.csv [steps]
    python3 tools/cuda/ncu_summary.py ncu.csv --step greedy_combine

Groups kernels by name (template arguments kept), prints total us, calls and share, largest first.
With --step NAME: only the kernels after the second-to-last launch whose name contains NAME, up to
and including the last one (one whole step when NAME is the step's last kernel), grouped, then
listed in launch order.
"""
import csv
import sys
from collections import defaultdict


def read(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1000.0 if unit.startswith("n") else v if unit.startswith("u") else v * 1000.0
        rows.append((r["Kernel Name"], us))
    return rows


def last_step(rows, marker):
    ends = [i for i, (name, _) in enumerate(rows) if marker in name]
    if len(ends) < 2:
        sys.exit(f"fewer than two launches of a kernel named like '{marker}'")
    return rows[ends[-2] + 1:ends[-1] + 1]


def short(name):
    # The kernel's own name with its template arguments, without the return type and parameters.
    head = name.split("(")[0]
    return head.replace("void ", "")[:110]


def main():
    args = sys.argv[1:]
    marker = None
    if "--step" in args:
        i = args.index("--step")
        marker = args[i + 1]
        del args[i:i + 2]
    rows = read(args[0])
    steps = float(args[1]) if len(args) > 1 else 1.0
    if marker:
        rows = last_step(rows, marker)
        steps = 1.0
    total = sum(us for _, us in rows)
    by = defaultdict(lambda: [0.0, 0])
    for name, us in rows:
        by[name][0] += us
        by[name][1] += 1
    print(f"{len(rows)} kernels, {total / steps:.1f} us of kernel time per step")
    for name, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:40]:
        print(f"{us / steps:9.1f} us {100 * us / total:5.1f}% {n / steps:6.0f}x  {name[:150]}")
    if marker:
        print("\nin launch order (us, kernel):")
        for name, us in rows:
            print(f"{us:8.2f}  {short(name)}")


if __name__ == "__main__":
    main()
