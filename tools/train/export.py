#!/usr/bin/env python3
"""Convert the trained HF checkpoints to GGUF with llama.cpp's converter and quantizer.

    python tools/train/export.py --ckpt build-train-work/ckpt --out build-train-work/gguf

For each model (dense -> qwen35-chat-tiny, moe -> qwen35moe-chat-tiny): convert_hf_to_gguf.py from
the pinned llama-cpp-python sdist (tools/fixtures/llamacpp.py; the MTP block kept, as nextn block
n_layer) to F16, then llama.cpp's quantizer (the pinned wheel) F16 -> Q8_0 and Q4_K_M. Writes
gguf.json (sizes, sha256, tensor types of every file).
"""
import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fixtures"))

import llamacpp  # noqa: E402
import tokenizer_build  # noqa: E402

NAMES = {"dense": "qwen35-chat-tiny", "moe": "qwen35moe-chat-tiny"}
QUANTS = ["Q8_0", "Q4_K_M"]


def chkhsh(hf_dir: Path) -> str:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    return tokenizer_build.chkhsh(lambda s: tok.encode(s, add_special_tokens=False).ids)


def export(hf_dir: Path, stem: str, out: Path, llama_src: Path, threads: int) -> dict:
    files = {"F16": out / f"{stem}.F16.gguf"}
    llamacpp.convert(llama_src, hf_dir, files["F16"], "f16", chkhsh(hf_dir), mtp=True)
    for q in QUANTS:
        files[q] = out / f"{stem}.{q}.gguf"
        llamacpp.quantize(files["F16"], files[q], q, threads)
    return {k: {"file": p.name, **llamacpp.gguf_summary(p)} for k, p in files.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, required=True, help="folder with dense/hf and moe/hf")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/qwenrt-fixtures")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["dense", "moe"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    llama_src = llamacpp.ensure_sources(args.cache)
    report = {}
    for kind in args.models:
        report[NAMES[kind]] = export(args.ckpt / kind / "hf", NAMES[kind], args.out, llama_src, args.threads)
        print(NAMES[kind], {k: (v["bytes"], v["tensor_types"]) for k, v in report[NAMES[kind]].items()}, flush=True)
    llamacpp.write_json(args.out / "gguf.json", report)


if __name__ == "__main__":
    main()
