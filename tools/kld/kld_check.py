#!/usr/bin/env python3
"""KL-divergence figures and sanity checks around tools/kld/to_llamacpp_kl_base.py (numpy only).

    kld_check.py exact BASE.npy OTHER.npy     KL(base || other) over the whole vocabulary, as
                                              `qwenrt perplexity --kl-base` computes it
    kld_check.py llamacpp BASE.kld OTHER.npy  KL(base || other) as llama-perplexity --kl-divergence
                                              computes it: base log-probs from the uint16 file,
                                              only entries with log p > -16 summed
    kld_check.py roundtrip BASE.kld           llama.cpp file -> parsed -> written again (bytes equal?),
                                              and decoded -> re-encoded (codes, scale, min equal?);
                                              entries at the floor decoded 100 nats below it
    kld_check.py tokens A B                   compare two token-id sources (qwenrt tokenize output
                                              or llama.cpp base files)
    kld_check.py paired [--name cpu] REF.npy CPU.npy LLAMA.kld
                                              per position KL(ref || cpu) and KL(ref || llama.cpp) over
                                              the reference's entries with log p > -16 (llama.cpp's
                                              support), llama.cpp's log-probs read from its own base
                                              file of the same text (uint16, as stored); means and
                                              the paired difference; --name: the backend
                                              whose logits CPU.npy holds (cuda: cuda_* keys)
    kld_check.py decode BASE.kld OUT.npy      llama.cpp file -> a --save-logits style file of its
                                              dequantised log-probs (for a converter round trip;
                                              entries at the floor 100 nats below it)

*.npy are `qwenrt perplexity --save-logits` files. The floor of llama.cpp's format for a base is
`llamacpp BASE.kld BASE.npy`: the base's own float32 log-probs against their uint16 encoding.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import to_llamacpp_kl_base as fmt  # noqa: E402


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """perplexity.cpp's percentile(): linear between neighbours of a sorted list."""
    p = fraction * (len(sorted_values) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * sorted_values[ip] + p * sorted_values[min(ip + 1, len(sorted_values) - 1)])


def summary(kl: np.ndarray, same_top: np.ndarray, nll_base: np.ndarray, nll: np.ndarray) -> dict:
    s = np.sort(kl)
    n = len(kl)
    return {"rows": n, "mean_kld": float(kl.mean()),
            "mean_kld_err": float(np.sqrt(max(0.0, (kl ** 2).mean() - kl.mean() ** 2) / (n - 1))),
            "median_kld": float(np.median(kl)), "p99_kld": percentile(s, 0.99),
            "p999_kld": percentile(s, 0.999), "max_kld": float(s[-1]),
            "same_top1_pct": 100.0 * float(same_top.mean()),
            "ppl_base": float(np.exp(nll_base.mean())), "ppl_other": float(np.exp(nll.mean()))}


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def exact(base_npy: Path, other_npy: Path) -> dict:
    lb, tb = fmt.read_qwenrt_logits(base_npy)
    lo, to = fmt.read_qwenrt_logits(other_npy)
    if lb.shape != lo.shape or not np.array_equal(tb, to):
        sys.exit("the two files are not of the same text (shapes or next-token ids differ)")
    lb64, lo64 = lb.astype(np.float64), lo.astype(np.float64)
    kl = (np.exp(lb64) * (lb64 - lo64)).sum(axis=1)
    rows = np.arange(len(tb))
    same = lb.argmax(axis=1) == lo.argmax(axis=1)
    return summary(kl, same, -lb64[rows, tb], -lo64[rows, tb])


def llamacpp(base_kld: Path, other_npy: Path) -> dict:
    b = fmt.read_llamacpp_base(base_kld)
    lo, to = fmt.read_qwenrt_logits(other_npy)
    n_vocab = b["n_vocab"]
    if lo.shape != (len(b["rows"]), n_vocab):
        sys.exit(f"{other_npy}: {lo.shape}, the base has {len(b['rows'])} rows of {n_vocab}")
    fmt.check_targets(to, b["tokens"], b["n_ctx"])
    p_log_base, _, _ = fmt.decode_rows(b["rows"], n_vocab)
    lb = p_log_base.astype(np.float64)
    # the other side as llama.cpp treats its logits: log-softmax in float (max + log(sum expf))
    x = np.asarray(lo, dtype=np.float32)
    mx = x.max(axis=1)
    lse = np.log(np.exp(x - mx[:, None]).astype(np.float64).sum(axis=1)).astype(np.float32)
    mx_full = (mx + lse).astype(np.float64)
    mask = p_log_base > np.float32(-16)
    kl = np.where(mask, np.exp(lb) * (lb - x.astype(np.float64) + mx_full[:, None]), 0.0).sum(axis=1)
    rows = np.arange(len(to))
    same = p_log_base.argmax(axis=1) == x.argmax(axis=1)
    return summary(kl, same, -lb[rows, to], mx_full - x[rows, to].astype(np.float64))


def roundtrip(base_kld: Path) -> dict:
    b = fmt.read_llamacpp_base(base_kld)
    n_vocab = b["n_vocab"]
    tmp = base_kld.with_suffix(base_kld.suffix + ".rewritten")
    fmt.write_llamacpp_base(tmp, b["n_ctx"], n_vocab, b["tokens"], b["rows"])
    bytes_equal = tmp.read_bytes() == base_kld.read_bytes()
    tmp.unlink()
    lp, scale, mn = fmt.decode_rows(b["rows"], n_vocab)
    re = fmt.encode_rows(fmt.decode_rows(b["rows"], n_vocab, below_floor=-100.0)[0])
    lp2, scale2, mn2 = fmt.decode_rows(re, n_vocab)
    dq = re[:, 4:4 + n_vocab].astype(np.int64) - b["rows"][:, 4:4 + n_vocab].astype(np.int64)
    return {"rows": len(b["rows"]), "container_bytes_equal": bool(bytes_equal),
            "codes_equal_pct": 100.0 * float((dq == 0).mean()), "max_code_diff": int(np.abs(dq).max()),
            "max_rel_scale_diff": float(np.abs(scale2 / scale - 1).max()),
            "max_min_log_prob_diff": float(np.abs(mn2 - mn).max()),
            "max_abs_logprob_diff": float(np.abs(lp2 - lp).max()),
            "max_scale": float(scale.max())}


def tokens(a: Path, b: Path) -> dict:
    ta, tb = fmt.read_token_ids(a), fmt.read_token_ids(b)
    n = min(len(ta), len(tb))
    diff = np.nonzero(ta[:n] != tb[:n])[0]
    return {"len_a": len(ta), "len_b": len(tb), "compared": n, "differ": len(diff),
            "first_difference": int(diff[0]) if len(diff) else None}


def paired(ref_npy: Path, cpu_npy: Path, llama_kld: Path, name: str = "cpu") -> dict:
    lr, tr = fmt.read_qwenrt_logits(ref_npy)
    lc, tc = fmt.read_qwenrt_logits(cpu_npy)
    b = fmt.read_llamacpp_base(llama_kld)
    if lr.shape != lc.shape or not np.array_equal(tr, tc) or len(b["rows"]) != len(tr):
        sys.exit("the three files are not of the same text and length")
    fmt.check_targets(tr, b["tokens"], b["n_ctx"])
    ll, _, _ = fmt.decode_rows(b["rows"], b["n_vocab"])
    r = lr.astype(np.float64)
    p = np.exp(r)
    # llama.cpp's support: reference entries with log p > -16. Below it llama.cpp's file holds only
    # "at or below the floor", which read as the floor would bias its KLD down by ~1e-5.
    keep = lr > np.float32(-16)
    kl_cpu = np.where(keep, p * (r - lc.astype(np.float64)), 0.0).sum(axis=1)
    kl_llama = np.where(keep, p * (r - ll.astype(np.float64)), 0.0).sum(axis=1)
    d = kl_cpu - kl_llama
    n = len(d)
    top = lr.argmax(axis=1)
    c = name
    return {"rows": n, f"{c}_mean_kld": float(kl_cpu.mean()), "llama_mean_kld": float(kl_llama.mean()),
            f"{c}_p99_kld": percentile(np.sort(kl_cpu), 0.99),
            "llama_p99_kld": percentile(np.sort(kl_llama), 0.99),
            f"{c}_minus_llama": float(d.mean()),
            f"{c}_minus_llama_err": float(d.std(ddof=1) / np.sqrt(n)),
            f"rows_{c}_lower": int((d < 0).sum()),
            f"{c}_same_top1_pct": 100.0 * float((lc.argmax(axis=1) == top).mean()),
            "llama_same_top1_pct": 100.0 * float((ll.argmax(axis=1) == top).mean())}


def decode(base_kld: Path, out_npy: Path) -> dict:
    b = fmt.read_llamacpp_base(base_kld)
    n_ctx, n_vocab = b["n_ctx"], b["n_vocab"]
    lp, _, _ = fmt.decode_rows(b["rows"], n_vocab, below_floor=-100.0)
    spc, first = fmt.scored_per_chunk(n_ctx), n_ctx // 2
    idx = (np.arange(b["n_chunk"])[:, None] * n_ctx + first + 1 + np.arange(spc)[None, :]).ravel()
    np.save(out_npy, np.concatenate([lp, b["tokens"][idx, None].astype(np.float32)], axis=1))
    return {"rows": len(lp), "n_vocab": n_vocab, "out": str(out_npy)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    parsers = {}
    for name, nargs in (("exact", 2), ("llamacpp", 2), ("roundtrip", 1), ("tokens", 2), ("decode", 2),
                        ("paired", 3)):
        parsers[name] = sub.add_parser(name)
        parsers[name].add_argument("files", type=Path, nargs=nargs)
    parsers["paired"].add_argument("--name", default="cpu",
                                   help="the backend whose logits the second file holds (cpu)")
    args = ap.parse_args()
    fn = {"exact": exact, "llamacpp": llamacpp, "roundtrip": roundtrip, "tokens": tokens,
          "decode": decode, "paired": paired}[args.cmd]
    extra = {"name": args.name} if args.cmd == "paired" else {}
    print(json.dumps(fn(*args.files, **extra), indent=1))


if __name__ == "__main__":
    main()
