#!/usr/bin/env python3
"""Build the training data for the tiny chat models: corpus -> tokenizer -> packed token windows.

    python tools/train/make_data.py --out build-train-data
    python tools/train/make_data.py --out build-train-copy --mix copy --seed 20261212 \
        --docs 90000 --tokenizer build-train-data/tokenizer        # second-stage data, same tokenizer

Writes into --out (a gitignored folder that travels to the GPU machine in `carry`):
  tokenizer/        tokenizer.json + tokenizer_config.json (official chat template), HF layout
  train.npz         `windows`: uint16 [n, SEQ_LEN] token ids, PAD_SENTINEL after the last document
  eval.json         the held-out evaluation sets (corpus.eval_sets()) and the tokenizer facts
  manifest.json     seed, sizes, document counts, versions

Packing: documents (each a whole rendered conversation, or a plain-text document) are laid end to
end in a window while they fit; a window starts with a document's first token, and a document
that does not fit starts the next window (the tail is padding, masked out of the loss). Documents
longer than SEQ_LEN are dropped and counted.
"""
import argparse
import collections
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fixtures"))
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402  (tools/train/corpus.py: first on the path)
import tokenizer_build  # noqa: E402

N_BPE = 3040            # byte-level BPE tokens; the 26 Qwen added tokens follow (3066 in all)
VOCAB_ROWS = 3072       # embedding rows (the padding rows are never produced)
SEQ_LEN = 512
PAD_SENTINEL = 65535
N_TOKENIZER_DOCS = 30000


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tokenizer_text(text: str) -> str:
    # The added tokens are matched before BPE at encode time; keep their text out of the merges.
    for s in corpus.SPECIAL_TEXTS:
        text = text.replace(s, "\n")
    return text


def build_tokenizer(out: Path, seed: int):
    texts = [tokenizer_text(t) for _, t in corpus.generate(seed + 7, N_TOKENIZER_DOCS)]
    texts += [f"{q}\n\n{d}" for q, d in corpus.doc_split("train")]
    tok = tokenizer_build.train(N_BPE, seed, 0, texts=texts)
    tokenizer_build.save(tok, out / "tokenizer", corpus.template(), model_max_length=4096)
    return tok


def pack(docs_ids: list[list[int]], seq_len: int) -> tuple[np.ndarray, int]:
    windows, cur, dropped = [], [], 0
    for ids in docs_ids:
        if len(ids) > seq_len:
            dropped += 1
            continue
        if len(cur) + len(ids) > seq_len:
            windows.append(cur + [PAD_SENTINEL] * (seq_len - len(cur)))
            cur = []
        cur += ids
    if cur:
        windows.append(cur + [PAD_SENTINEL] * (seq_len - len(cur)))
    return np.asarray(windows, dtype=np.uint16), dropped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE.parents[1] / "build-train-data")
    ap.add_argument("--docs", type=int, default=110000)
    ap.add_argument("--seed", type=int, default=corpus.SEED)
    ap.add_argument("--mix", choices=sorted(corpus.MIXES), default="base", help="document mix (corpus.MIXES)")
    ap.add_argument("--tokenizer", type=Path, help="reuse this tokenizer folder (a stage-1 data dir's "
                    "tokenizer/) instead of training one: a second stage must keep the first stage's vocabulary")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    if args.tokenizer:
        from tokenizers import Tokenizer
        log(f"reusing tokenizer {args.tokenizer}")
        (args.out / "tokenizer").mkdir(exist_ok=True)
        for f in args.tokenizer.iterdir():
            (args.out / "tokenizer" / f.name).write_bytes(f.read_bytes())
        tok = Tokenizer.from_file(str(args.out / "tokenizer" / "tokenizer.json"))
    else:
        log("training tokenizer")
        tok = build_tokenizer(args.out, args.seed)
    vocab = tok.get_vocab()
    assert tok.get_vocab_size() <= VOCAB_ROWS

    log(f"generating {args.docs} documents ({args.mix} mix)")
    kinds, texts = [], []
    for k, t in corpus.generate(args.seed, args.docs, mix=args.mix):
        kinds.append(k)
        texts.append(t)
    corpus.check_heldout(texts, validation=args.mix not in corpus.MIXES_BEFORE_VALIDATION)

    log("tokenizing")
    enc = tok.encode_batch(texts, add_special_tokens=False)
    ids = [e.ids for e in enc]
    tokens_by_kind = collections.Counter()
    for k, i in zip(kinds, ids):
        tokens_by_kind[k] += len(i)
    windows, dropped = pack(ids, SEQ_LEN)
    n_real = int((windows != PAD_SENTINEL).sum())
    np.savez_compressed(args.out / "train.npz", windows=windows)
    log(f"{len(windows)} windows of {SEQ_LEN}: {n_real} tokens ({n_real / windows.size:.1%} filled), "
        f"{dropped} documents dropped as too long")

    ev = corpus.eval_sets()
    ev["tokenizer"] = {"ids": {t: vocab[t] for t, _ in tokenizer_build.ADDED_TOKENS},
                       "llama_cpp_chkhsh": tokenizer_build.chkhsh(lambda s: tok.encode(s).ids)}
    (args.out / "eval.json").write_text(json.dumps(ev, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    manifest = {
        "generator": "tools/train/make_data.py", "seed": args.seed, "mix": args.mix,
        "tokenizer_from": str(args.tokenizer) if args.tokenizer else None, "documents": args.docs,
        "documents_by_kind": dict(collections.Counter(kinds)), "tokens_by_kind": dict(tokens_by_kind),
        "tokens": n_real, "windows": len(windows), "seq_len": SEQ_LEN, "dropped_too_long": dropped,
        "bpe_tokens": N_BPE, "tokenizer_tokens": tok.get_vocab_size(), "vocab_rows": VOCAB_ROWS,
        "pad_sentinel": PAD_SENTINEL, "eos_id": vocab["<|im_end|>"], "pad_id": vocab["<|endoftext|>"],
        "docstrings_python": corpus.DOCS_PYTHON, "docstrings": len(corpus.docstrings()),
        "docstrings_heldout": len(corpus.doc_split("eval")),
        "versions": {"python": platform.python_version(), "tokenizers": metadata.version("tokenizers"),
                     "jinja2": metadata.version("jinja2")},
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(json.dumps(manifest))


if __name__ == "__main__":
    main()
