#!/usr/bin/env python3
"""How much of a text's tokens a draft vocabulary of the first N ids covers (--draft-vocab N).

An MTP draft restricted to ids < N can only be right where the next token is one of them, so the
share of a text's tokens below N bounds the acceptance a --draft-vocab N keeps (of the full
head's). Tokenizes each group of files with `qwenrt tokenize` (in pieces of at most 64 KB, split at
line ends) and prints the share of tokens below each N, as a Markdown table.

    python3 bench/draft_vocab_coverage.py [QWENRT [VOCAB.gguf]]
    (default build/qwenrt and llama.cpp's models/ggml-vocab-qwen35.gguf from the pinned
    llama-cpp-python sdist, downloaded into build-llamacpp/ by tools/fixtures/llamacpp.py)
"""
import glob
import subprocess
import sys
from pathlib import Path

LIMITS = [8192, 16384, 32768, 65536, 131072]
GROUPS = {
    "English prose (docs/*.md, README.md)": ["docs/*.md", "README.md"],
    "C++ (src/**/*.cpp, *.h)": ["src/**/*.cpp", "src/**/*.h"],
    "Python (tools/**/*.py, bench/*.py)": ["tools/**/*.py", "bench/*.py"],
    "Multilingual tokenizer cases": ["../shared/fixtures/qwen35-tokenizer-cases.inp"],
    "Chat template (jinja)": ["../shared/fixtures/qwen3.5-chat-template.jinja"],
}
PIECE = 64 * 1024


def pieces(text):
    start = 0
    while start < len(text):
        end = min(len(text), start + PIECE)
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut > start else end
        yield text[start:end]
        start = end


def token_ids(binary, vocab, text):
    ids = []
    for piece in pieces(text):
        if not piece.strip():
            continue
        out = subprocess.run([binary, "tokenize", "-m", vocab, piece], check=True,
                             capture_output=True, text=True).stdout
        ids.extend(int(t) for t in out.split())
    return ids


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "build/qwenrt"
    if len(sys.argv) > 2:
        vocab = sys.argv[2]
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "fixtures"))
        import llamacpp  # the pinned sdist (checked by its sha256)
        vocab = str(llamacpp.ensure_sources(Path("build-llamacpp")) / "models" / "ggml-vocab-qwen35.gguf")
    print("| text | tokens | " + " | ".join(f"ids < {n:,}" for n in LIMITS) + " |")
    print("|---|---:|" + "---:|" * len(LIMITS))
    everything = []
    for name, patterns in GROUPS.items():
        files = sorted({f for p in patterns for f in glob.glob(p, recursive=True)})
        ids = []
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                ids.extend(token_ids(binary, vocab, fh.read()))
        everything.extend(ids)
        if ids:
            shares = [100.0 * sum(i < n for i in ids) / len(ids) for n in LIMITS]
            print(f"| {name} | {len(ids):,} | " + " | ".join(f"{s:.1f}%" for s in shares) + " |")
    shares = [100.0 * sum(i < n for i in everything) / len(everything) for n in LIMITS]
    print(f"| all | {len(everything):,} | " + " | ".join(f"{s:.1f}%" for s in shares) + " |")


if __name__ == "__main__":
    main()
