#!/usr/bin/env python3
"""Markdown for bench/h200/expert_stream.sh: qwenrt's streamed experts against llama.cpp's
`--n-cpu-moe`, per pair of about the same device memory for experts.

  expert_stream_report.py RAW --pairs "G:N ..." --rounds R [--command S] [--gpu S]

RAW holds, per round r and pair: llama-ncmoe<N>-r<r>.out (llama-bench -o json),
qwenrt-cache<G>-r<r>.out and, where run, qwenrt-file-cache<G>-r<r>.out (qwenrt bench --json),
each with .rc and .mem (peak device MiB, -1 unknown). tok/s are medians over every repeat of
every round; the ratio is qwenrt over llama.cpp; MB read a token is the mean of the runs' own.
"""
import argparse
import json
import statistics
from pathlib import Path


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def ok(raw: Path, name: str) -> bool:
    rc = raw / f"{name}.rc"
    return rc.exists() and rc.read_text().strip() == "0"


def peak(raw: Path, name: str) -> int:
    try:
        return int((raw / f"{name}.mem").read_text().strip())
    except (OSError, ValueError):
        return -1


def llama_rates(doc) -> dict:
    """test name (pp512, tg32) -> every repeat's tok/s."""
    out = {}
    for e in doc or []:
        if e.get("n_prompt", 0) > 0 and e.get("n_gen", 0) == 0:
            test = f"pp{e['n_prompt']}"
        elif e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0:
            test = f"tg{e['n_gen']}"
        else:
            continue
        out.setdefault(test, []).extend(e.get("samples_ts") or [e.get("avg_ts")])
    return out


def qwenrt_rates(doc) -> tuple[dict, dict]:
    """test -> every repeat's tok/s; test -> the experts' counters."""
    rates, experts = {}, {}
    for r in (doc or {}).get("results", []):
        rates.setdefault(r["test"], []).extend(r["tokens"] / s for s in r["seconds"] if s > 0)
        if "experts" in r:
            experts[r["test"]] = r["experts"]
    return rates, experts


def fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", type=Path)
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--command", default="")
    ap.add_argument("--gpu", default="")
    a = ap.parse_args()
    pairs = [p.split(":") for p in a.pairs.split()]
    lines = ["# Streamed experts: qwenrt `--expert-cache` vs llama.cpp `--n-cpu-moe`", ""]
    if a.command:
        lines += [f"Command: `{a.command}`", ""]
    if a.gpu:
        lines += [f"- GPU: {a.gpu}."]
    lines += [
        "- tok/s: medians over every repeat of every round (the tools alternate each round). "
        "Device MiB: the peak of `nvidia-smi memory.used` while the process ran (max of rounds).",
        "- qwenrt: misses from the pinned host copy; \"file\": `QWENRT_CUDA_EXPERT_HOST=0`.",
        "",
        "| experts on the device | tool | test | tok/s | qwenrt / llama.cpp | device MiB | hit rate | MB read / token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g, n in pairs:
        runs = {"llama.cpp": f"llama-ncmoe{n}", "qwenrt": f"qwenrt-cache{g}",
                "qwenrt (file)": f"qwenrt-file-cache{g}"}
        rates, experts, mem = {}, {}, {}
        for tool, stem in runs.items():
            names = [f"{stem}-r{r}" for r in range(1, a.rounds + 1)]
            names = [x for x in names if (a.raw / f"{x}.rc").exists()]
            if not names:
                continue
            rates[tool], experts[tool] = {}, {}
            mem[tool] = max(peak(a.raw, x) for x in names)
            for x in names:
                if not ok(a.raw, x):
                    rates[tool].setdefault("failed", []).append(x)
                    continue
                doc = load(a.raw / f"{x}.out")
                if tool == "llama.cpp":
                    got, ex = llama_rates(doc), {}
                else:
                    got, ex = qwenrt_rates(doc)
                for t, v in got.items():
                    rates[tool].setdefault(t, []).extend(v)
                for t, v in ex.items():
                    acc = experts[tool].setdefault(t, {"lookups": 0, "hits": 0, "bytes": 0, "runs": 0})
                    acc["lookups"] += v.get("lookups", 0)
                    acc["hits"] += v.get("hits", 0)
                    acc["bytes"] += v.get("bytes_per_token", 0)
                    acc["runs"] += 1
        base = {t: statistics.median(v) for t, v in rates.get("llama.cpp", {}).items() if t != "failed" and v}
        label = f"{g} GiB / ncmoe {n}"
        for tool in runs:
            if tool not in rates:
                continue
            if rates[tool].get("failed"):
                lines.append(f"| {label} | {tool} | failed: {', '.join(rates[tool]['failed'])} | | | | | |")
            for t in sorted(x for x in rates[tool] if x != "failed"):
                med = statistics.median(rates[tool][t])
                ratio = "" if tool == "llama.cpp" or t not in base else f"**{med / base[t]:.2f}**"
                ex = experts[tool].get(t)
                hit = fmt(100 * ex["hits"] / ex["lookups"]) + "%" if ex and ex["lookups"] else "-"
                mb = fmt(ex["bytes"] / ex["runs"] / 1e6, 2) if ex and ex["runs"] else "-"
                m = mem[tool]
                lines.append(f"| {label} | {tool} | {t} | {fmt(med)} | {ratio} | {m if m >= 0 else '-'} | {hit} | {mb} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
