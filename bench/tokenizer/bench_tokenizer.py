"""Tokenizer throughput: qwenrt's C++ tokenizer (tokenizer_tool bench) against HF tokenizers on
the same text, the real Qwen3.5 vocabulary, this machine. Prints a markdown table of medians.

  python3 bench/tokenizer/bench_tokenizer.py --tool build/tokenizer_tool --work-dir build/tokenizer_bench

Text: tools/tokenizer/parity_corpus.benchmark_text (seeded mix of English, code, CJK, Cyrillic,
Arabic, emoji, digits, whitespace), valid UTF-8. Both sides encode without parsing special tokens.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "tokenizer"))

import parity_corpus  # noqa: E402
import qwen_vocab  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def timed(fn, repeats: int):
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, required=True)
    ap.add_argument("--bytes", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    gguf_path, json_path = qwen_vocab.build("qwen35", args.work_dir)
    text = parity_corpus.benchmark_text(args.seed, args.bytes)
    text_path = args.work_dir / "bench.txt"
    text_path.write_bytes(text.encode())
    n_bytes = len(text.encode())

    ours = json.loads(subprocess.run([str(args.tool), "bench", str(gguf_path), str(text_path), str(args.repeats)],
                                     check=True, capture_output=True, text=True).stdout)

    start = time.perf_counter()
    hf = Tokenizer.from_file(str(json_path))
    hf_load = time.perf_counter() - start
    hf_one, enc = timed(lambda: hf.encode(text, add_special_tokens=False), args.repeats)
    lines = text.split("\n")
    hf_batch, _ = timed(lambda: hf.encode_batch(lines, add_special_tokens=False), args.repeats)
    if len(enc.ids) != ours["tokens"]:
        print(f"token counts differ: ours {ours['tokens']}, HF {len(enc.ids)}", file=sys.stderr)
        return 1

    mb = n_bytes / 1e6
    print(f"text: {n_bytes} bytes, {ours['tokens']} tokens; median of {args.repeats}; "
          f"{os.cpu_count()} CPUs ({cpu_name()}); "
          f"tokenizers {metadata.version('tokenizers')}\n")
    print("| tokenizer | load (s) | encode (s) | MB/s | tokens/s | vs HF one call |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = [("qwenrt (C++, 1 thread, one call)", ours["gguf_open_s"] + ours["from_gguf_s"], ours["median_s"]),
            ("HF tokenizers encode (one call)", hf_load, hf_one),
            (f"HF tokenizers encode_batch ({len(lines)} lines, all CPUs)", hf_load, hf_batch)]
    for name, load, sec in rows:
        print(f"| {name} | {load:.2f} | {sec:.3f} | {mb / sec:.2f} | {ours['tokens'] / sec:,.0f} | {hf_one / sec:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
