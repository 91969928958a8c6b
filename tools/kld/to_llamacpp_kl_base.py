#!/usr/bin/env python3
"""Turn a `qwenrt perplexity --save-logits` file into a llama.cpp KL-divergence base file.

    qwenrt perplexity --backend ref -m M.gguf -f TEXT --ctx 512 --chunks 8 --save-logits base.npy
    qwenrt tokenize -m M.gguf "$(cat TEXT)" > ids.txt          # or --tokens-from a llama.cpp base
    python tools/kld/to_llamacpp_kl_base.py --logits base.npy --tokens ids.txt --ctx 512 -o base.kld
    llama-perplexity -m M.gguf -c 512 --kl-divergence-base base.kld --kl-divergence

Then llama.cpp's KL divergence and "Same top p" are measured against qwenrt's reference logits.

Our file (src/cli/cmd_perplexity.cpp): .npy float32 [n_scored, n_vocab + 1], the log-probabilities
of every scored position, then the id of the token that followed. Chunks of --ctx tokens, the
second half of each scored (positions ctx/2 .. ctx-2 predict ctx/2+1 .. ctx-1): ctx - 1 - ctx/2
rows per chunk, as llama.cpp's perplexity scores them.

llama.cpp's file (tools/perplexity/perplexity.cpp, perplexity() with --kl-divergence-base and
kl_divergence()), little-endian:
    "_logits_"                 8 bytes
    n_ctx                      uint32
    n_vocab                    int32
    n_chunk                    int32
    tokens                     int32 [n_chunk * n_ctx]   every token of every chunk (read back and
                                                         evaluated by the --kl-divergence run)
    per chunk, per scored row  uint16 [nv], nv = 2*((n_vocab + 1)/2) + 4:
        float32 scale, float32 min_log_prob  (the first 4 uint16)
        uint16 q[n_vocab]                    log p_i = scale * q_i + min_log_prob
        (one zero uint16 of padding where n_vocab is odd)
The row's range is clipped 16 nats below its maximum: min_logit = max(min, max - 16),
scale = (max - min_logit) / 65535, q_i = round((logit_i - min_logit) / scale) where
logit_i > min_logit, else 0. The KL run adds only base entries with log p > -16 (its floor).

The quantisation below follows llama.cpp's float32 arithmetic step by step; it is fed our log-probs
(llama.cpp feeds raw logits: the same up to a shift per row, which the encoding removes).
numpy only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

MAGIC = b"_logits_"


def nv_of(n_vocab: int) -> int:
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


def encode_rows(logits: np.ndarray) -> np.ndarray:
    """[n, n_vocab] logits (or log-probs) -> [n, nv] uint16 rows, as perplexity.cpp's log_softmax()."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    n, n_vocab = x.shape
    f32 = np.float32
    max_logit = x.max(axis=1)
    min_logit = np.maximum(x.min(axis=1), max_logit - f32(16))
    # sum_exp += expf(logit - max) in double; log_sum_exp = (float) log(sum_exp)
    sum_exp = np.exp(x - max_logit[:, None]).astype(np.float64).sum(axis=1)
    log_sum_exp = np.log(sum_exp).astype(f32)
    min_log_prob = (min_logit - max_logit) - log_sum_exp
    scale = (max_logit - min_logit) / f32(65535)
    out = np.zeros((n, nv_of(n_vocab)), dtype=np.uint16)
    head = np.stack([scale, min_log_prob], axis=1).astype("<f4")
    out[:, :4] = head.view("<u2").reshape(n, 4)
    ok = scale != 0
    with np.errstate(divide="ignore"):
        inv_scale = np.where(ok, f32(1) / np.where(ok, scale, f32(1)), f32(0)).astype(f32)
    # nearest_int(): float + 12582912.f, i.e. round half to even in float32 (values < 2^22)
    q = np.rint(inv_scale[:, None] * (x - min_logit[:, None])).astype(np.int64) & 0xFFFF
    q = np.where(x > min_logit[:, None], q, 0)
    q[~ok] = 0
    out[:, 4:4 + n_vocab] = q.astype(np.uint16)
    return out


def decode_rows(rows: np.ndarray, n_vocab: int, below_floor: float | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[n, nv] uint16 rows -> (log-probs float32 [n, n_vocab], scale [n], min_log_prob [n]).

    As llama.cpp reads them: log p = scale * q + min_log_prob. In a row whose range was clipped
    (16 nats), q == 0 stands for "at or below the floor"; below_floor, where given, is added to those
    entries (e.g. -100: probability ~0) instead of leaving them at the floor, whose e^-16 each add up
    to ~n_vocab * 1.1e-7 of mass that the original row did not have.
    """
    head = np.ascontiguousarray(rows[:, :4]).view("<f4").reshape(-1, 2)
    scale, min_log_prob = head[:, 0].astype(np.float32), head[:, 1].astype(np.float32)
    q = rows[:, 4:4 + n_vocab]
    lp = scale[:, None] * q.astype(np.float32) + min_log_prob[:, None]
    if below_floor is not None:
        clipped = scale * np.float32(65535) >= np.float32(16) * np.float32(1 - 1e-5)
        lp = np.where(clipped[:, None] & (q == 0), lp + np.float32(below_floor), lp)
    return lp.astype(np.float32), scale, min_log_prob


def read_llamacpp_base(path: Path) -> dict:
    data = path.read_bytes()
    if data[:8] != MAGIC:
        sys.exit(f"{path}: not a llama.cpp log-probability file (no '_logits_' magic)")
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(data, "<i4", 3, 8))
    off = 20
    tokens = np.frombuffer(data, "<i4", n_chunk * n_ctx, off).copy()
    off += 4 * n_chunk * n_ctx
    nv, spc = nv_of(n_vocab), scored_per_chunk(n_ctx)
    want = off + 2 * n_chunk * spc * nv
    if len(data) != want:
        sys.exit(f"{path}: {len(data)} bytes, the header ({n_ctx=}, {n_vocab=}, {n_chunk=}) "
                 f"implies {want}")
    rows = np.frombuffer(data, "<u2", n_chunk * spc * nv, off).reshape(n_chunk * spc, nv).copy()
    return {"n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk, "tokens": tokens, "rows": rows}


def write_llamacpp_base(path: Path, n_ctx: int, n_vocab: int, tokens: np.ndarray,
                        rows: np.ndarray) -> None:
    n_chunk = len(tokens) // n_ctx
    assert len(tokens) == n_chunk * n_ctx and rows.shape == (n_chunk * scored_per_chunk(n_ctx),
                                                             nv_of(n_vocab))
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes())
        f.write(np.asarray(tokens, "<i4").tobytes())
        f.write(np.asarray(rows, "<u2").tobytes())


def read_qwenrt_logits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(log-probs float32 [n_scored, n_vocab], next-token ids int64 [n_scored])."""
    a = np.load(path, mmap_mode="r")
    if a.ndim != 2 or a.dtype != np.float32:
        sys.exit(f"{path}: expected float32 [n_scored, n_vocab + 1], got {a.dtype} {a.shape}")
    return a[:, :-1], a[:, -1].astype(np.int64)


def read_token_ids(path: Path) -> np.ndarray:
    """Token ids as `qwenrt tokenize` prints them (whitespace-separated), or a llama.cpp base file."""
    if path.read_bytes()[:8] == MAGIC:
        return read_llamacpp_base(path)["tokens"]
    return np.array([int(t) for t in path.read_text().split()], dtype=np.int64)


def check_targets(targets: np.ndarray, tokens: np.ndarray, n_ctx: int) -> None:
    """Row r of chunk c predicts tokens[c*n_ctx + n_ctx/2 + r + 1]: the saved ids must match."""
    spc, first = scored_per_chunk(n_ctx), n_ctx // 2
    n_chunk = len(targets) // spc
    idx = (np.arange(n_chunk)[:, None] * n_ctx + first + 1 + np.arange(spc)[None, :]).ravel()
    bad = np.nonzero(tokens[idx] != targets)[0]
    if len(bad):
        r = int(bad[0])
        sys.exit(f"token ids disagree with the saved logits at {len(bad)} of {len(targets)} scored "
                 f"positions (first: row {r}, id {int(tokens[idx[r]])} vs saved {int(targets[r])}): "
                 "not the same text, --ctx or tokenization")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logits", type=Path, required=True, help="qwenrt perplexity --save-logits file")
    ap.add_argument("--tokens", type=Path, required=True,
                    help="token ids of the text: `qwenrt tokenize` output, or a llama.cpp base file "
                         "of the same text (its token block is used)")
    ap.add_argument("--ctx", type=int, default=512, help="--ctx of the qwenrt run (512)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="llama.cpp base file to write")
    args = ap.parse_args()

    logp, targets = read_qwenrt_logits(args.logits)
    n_scored, n_vocab = logp.shape
    spc = scored_per_chunk(args.ctx)
    if n_scored % spc:
        sys.exit(f"{args.logits}: {n_scored} rows, not a whole number of chunks of {spc} "
                 f"(--ctx {args.ctx}, second halves scored)")
    n_chunk = n_scored // spc
    tokens = read_token_ids(args.tokens)
    if len(tokens) < n_chunk * args.ctx:
        sys.exit(f"{args.tokens}: {len(tokens)} ids, {n_chunk} chunks of {args.ctx} need "
                 f"{n_chunk * args.ctx}")
    tokens = tokens[:n_chunk * args.ctx]
    check_targets(targets, tokens, args.ctx)
    rows = np.concatenate([encode_rows(logp[i:i + 256]) for i in range(0, n_scored, 256)])
    write_llamacpp_base(args.out, args.ctx, n_vocab, tokens, rows)
    print(f"{args.out}: n_ctx {args.ctx}, n_vocab {n_vocab}, {n_chunk} chunks, {n_scored} rows")


if __name__ == "__main__":
    main()
