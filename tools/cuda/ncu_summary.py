"""Per-kernel time of one decode step from `ncu --csv --metrics gpu__time_duration.sum` output.

    python3 tools/cuda/ncu_summary.py ncu.csv [steps]

Groups kernels by name (template arguments kept), prints total us, calls and share, largest first.
"""
import csv
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
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
    total = sum(us for _, us in rows)
    by = defaultdict(lambda: [0.0, 0])
    for name, us in rows:
        by[name][0] += us
        by[name][1] += 1
    print(f"{len(rows)} kernels, {total / steps:.1f} us of kernel time per step")
    for name, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:40]:
        print(f"{us / steps:9.1f} us {100 * us / total:5.1f}% {n / steps:6.0f}x  {name[:150]}")


if __name__ == "__main__":
    main()
