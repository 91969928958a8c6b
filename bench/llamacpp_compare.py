#!/usr/bin/env python3
"""qwenrt and llama.cpp side by side on the same GGUF, in one run, as ratios.

    build-fixtures/venv/bin/python bench/llamacpp_compare.py -m models/qwen35-chat-tiny.Q8_0.gguf \
        -p 64,512 -n 64 -r 5 --out bench/results/tiny-ref-cpu.md

qwenrt: `qwenrt bench --json` (src/cli/cmd_bench.cpp). llama.cpp: the pinned llama-cpp-python
(tools/requirements-fixtures.txt) on the same file, the same figures measured the same way:
  ppP   a fresh context, one eval of P random token ids (logits of the last), after one untimed run
  tgN   a fresh context, 4 untimed single-token evals, then N timed single-token evals
Medians of the repeats; ratio = qwenrt tok/s / llama.cpp tok/s. Aggregate decode over several
sequences is qwenrt-only here (llama-cpp-python's high-level API runs one sequence).
"""
import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP = 4


def llamacpp_figures(model: Path, prefill: list[int], decode: int, repeats: int, threads: int, seed: int):
    from llama_cpp import Llama, __version__
    n_ctx = max(max(prefill), decode + WARMUP) + 8
    llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=max(prefill), n_ubatch=max(prefill),
                n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
    rng = random.Random(seed)
    n_vocab = llm.n_vocab()
    out = {}
    for p in prefill:
        secs = []
        for r in range(repeats + 1):               # repeat 0 warms up
            ids = [rng.randrange(n_vocab) for _ in range(p)]
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids)
            if r:
                secs.append(time.perf_counter() - t0)
        out[f"pp{p}"] = (p, secs)
    secs = []
    for _ in range(repeats):
        llm.reset()
        for _ in range(WARMUP):
            llm.eval([rng.randrange(n_vocab)])
        t0 = time.perf_counter()
        for _ in range(decode):
            llm.eval([rng.randrange(n_vocab)])
        secs.append(time.perf_counter() - t0)
    out[f"tg{decode}"] = (decode, secs)
    return out, __version__


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--qwenrt", type=Path, default=REPO / "build/qwenrt")
    ap.add_argument("-p", "--prefill", default="512")
    ap.add_argument("-n", "--decode", type=int, default=128)
    ap.add_argument("-b", "--batches", default="0", help="qwenrt aggregate decode batch sizes (0: none)")
    ap.add_argument("-r", "--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write a markdown report here")
    args = ap.parse_args()
    prefill = [int(x) for x in args.prefill.split(",")]

    cmd = [str(args.qwenrt), "bench", "-m", str(args.model), "-p", args.prefill, "-n", str(args.decode),
           "-b", args.batches, "-r", str(args.repeats), "--seed", str(args.seed), "--json"]
    ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    theirs, version = llamacpp_figures(args.model, prefill, args.decode, args.repeats, args.threads, args.seed)

    rows = []
    for r in ours["results"]:
        q = r["tok_s_median"]
        if r["test"] in theirs:
            n, secs = theirs[r["test"]]
            l = n / statistics.median(secs)
            rows.append((r["test"], q, f"{l:.1f}", f"{q / l:.3f}"))
        else:
            rows.append((r["test"], q, "not measured", "-"))
    lines = [f"# qwenrt vs llama.cpp: {args.model.name}", "",
             f"Command: `{' '.join([Path(sys.executable).name, 'bench/llamacpp_compare.py'] + sys.argv[1:])}`", "",
             f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs. qwenrt backend: {ours['backend']} "
             f"(reference, single-threaded); llama.cpp: llama-cpp-python {version}, {args.threads} threads. "
             f"Medians of {args.repeats} repeats, random token ids, one run of this script.", "",
             "| test | qwenrt tok/s | llama.cpp tok/s | ratio qwenrt / llama.cpp |", "|---|---|---|---|"]
    lines += [f"| {t} | {q:.1f} | {l} | {ratio} |" for t, q, l, ratio in rows]
    lines += ["", f"qwenrt peak RSS: {ours['peak_rss_mib']:.0f} MiB."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
