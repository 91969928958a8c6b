#!/usr/bin/env python3
"""Summary of a tools/kld/run.sh output folder: per model, the backend's and llama.cpp's KL divergence
to the reference backend and top-1 agreement, as JSON and as a markdown table (standard library only).

    summarize.py OUTDIR --backend cuda --json kld-summary.json --md kld-summary.md MODEL_NAME ...

MODEL_NAME: a model file's name without .gguf, as run.sh names its files. Reads, per model M and
backend B: B-M.log and ref-M.log (qwenrt perplexity), llama-vs-ref-M.log (llama-perplexity
--kl-divergence against the reference logits), check-*.json (kld_check.py), llama-vs-self*-M.log;
any of them missing reads as null.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

NUM = r"(-?[0-9.]+(?:e[-+]?[0-9]+)?|nan|-?inf)"


def grab(text: str | None, pattern: str, n: int = 1):
    """The numbers of the last match of pattern (floats), one or a tuple; None if absent."""
    if text is None:
        return None
    found = re.findall(pattern, text)
    if not found:
        return None
    last = found[-1]
    vals = [float(v) for v in (last if isinstance(last, tuple) else (last,))]
    return vals[0] if n == 1 else tuple(vals)


def read(path: Path) -> str | None:
    return path.read_text(errors="replace") if path.exists() else None


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def qwenrt_log(text: str | None) -> dict:
    ppl = grab(text, rf"PPL = {NUM} \+/- {NUM}", 2)
    kld = grab(text, rf"Mean KLD = {NUM} \+/- {NUM}  \(median {NUM}, max {NUM}\)", 4)
    top = grab(text, rf"Same top-1 = {NUM} % \+/- {NUM} %", 2)
    return {"ppl": ppl and ppl[0], "ppl_err": ppl and ppl[1],
            "mean_kld": kld and kld[0], "mean_kld_err": kld and kld[1],
            "median_kld": kld and kld[2], "max_kld": kld and kld[3],
            "same_top1_pct": top and top[0], "same_top1_pct_err": top and top[1]}


def llama_log(text: str | None) -> dict:
    kld = grab(text, rf"Mean    KLD: +{NUM} ± +{NUM}", 2)
    top = grab(text, rf"Same top p: +{NUM} ± +{NUM} %", 2)
    ppl = grab(text, rf"Mean PPL\(Q\) +: +{NUM} ± +{NUM}", 2)
    return {"ppl": ppl and ppl[0], "ppl_err": ppl and ppl[1],
            "mean_kld": kld and kld[0], "mean_kld_err": kld and kld[1],
            "median_kld": grab(text, rf"Median  KLD: +{NUM}"),
            "p99_kld": grab(text, rf"99\.0%   KLD: +{NUM}"),
            "max_kld": grab(text, rf"Maximum KLD: +{NUM}"),
            "same_top1_pct": top and top[0], "same_top1_pct_err": top and top[1]}


def model_summary(out: Path, m: str, backend: str) -> dict:
    b = backend
    s = {"model": m,
         "ref": {"ppl": qwenrt_log(read(out / f"ref-{m}.log"))["ppl"]},
         b: qwenrt_log(read(out / f"{b}-{m}.log")),
         f"{b}_exact": read_json(out / f"check-exact-{b}-{m}.json"),
         f"{b}_llamacpp_way": read_json(out / f"check-llamacpp-{b}-{m}.json"),
         "llama": llama_log(read(out / f"llama-vs-ref-{m}.log")),
         "paired": read_json(out / f"check-paired-{b}-{m}.json"),
         "checks": {"tokens": read_json(out / f"check-tokens-{m}.json"),
                    "roundtrip": read_json(out / f"check-roundtrip-{m}.json"),
                    "floor": read_json(out / f"check-floor-{m}.json"),
                    "ref_vs_llamabase": read_json(out / f"check-ref-vs-llamabase-{m}.json"),
                    "llama_vs_self": llama_log(read(out / f"llama-vs-self-{m}.log")),
                    "llama_vs_self_reenc": llama_log(read(out / f"llama-vs-self-reenc-{m}.log"))}}
    bk, lk = s[b]["mean_kld"], s["llama"]["mean_kld"]
    s["backend_le_llama"] = None if bk is None or lk is None else bool(bk <= lk)
    return s


def fmt(v, spec: str = ".4e") -> str:
    return "—" if v is None else format(v, spec)


def markdown(summ: dict) -> str:
    b = summ["backend"]
    lines = [f"# KL divergence to the reference backend: qwenrt {b} and llama.cpp", "",
             f"qwenrt --backend {b} -t {summ['threads']}; llama-perplexity -t {summ['threads']} "
             f"{summ['llama_args']}".rstrip() + f"; {summ['chunks']} chunks of 512, second halves "
             "scored. KLD in nats (mean ± standard error). qwenrt figures: `perplexity --kl-base` "
             "(whole vocabulary); \"llama.cpp's way\": the same logits scored against the 16-bit base "
             "(kld_check.py llamacpp); llama.cpp: `--kl-divergence` against the reference logits.", ""]
    lines += [f"| model | {b} KLD | {b} KLD, llama.cpp's way | llama.cpp KLD | {b} same top-1 | "
              f"llama.cpp same top p | {b} − llama.cpp (paired) | {b} <= llama.cpp |",
              "|---|---|---|---|---|---|---|---|"]
    for s in summ["models"]:
        q, w, ll, p = s[b], s[f"{b}_llamacpp_way"] or {}, s["llama"], s["paired"] or {}
        d, de = p.get(f"{b}_minus_llama"), p.get(f"{b}_minus_llama_err")
        le = {None: "—", True: "yes", False: "no"}[s["backend_le_llama"]]
        lines.append(
            f"| {s['model']} | {fmt(q['mean_kld'])} ± {fmt(q['mean_kld_err'], '.2e')} "
            f"| {fmt(w.get('mean_kld'))} | {fmt(ll['mean_kld'], '.6f')} ± {fmt(ll['mean_kld_err'], '.6f')} "
            f"| {fmt(q['same_top1_pct'], '.2f')} % | {fmt(ll['same_top1_pct'], '.3f')} % "
            f"| {fmt(d, '+.2e')} ± {fmt(de, '.2e')} | {le} |")
    lines += ["", "| model | ref PPL | " + b + " PPL | llama.cpp PPL | " + b + " median / max KLD "
              "| llama.cpp median / max KLD | tokens equal | llama.cpp vs itself | format floor |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in summ["models"]:
        q, ll, c = s[b], s["llama"], s["checks"]
        tok = c["tokens"]
        tok = "—" if tok is None else ("yes" if tok["differ"] == 0 else f"no ({tok['differ']} differ)")
        fl = c["floor"] or {}
        lines.append(
            f"| {s['model']} | {fmt(s['ref']['ppl'], '.4f')} | {fmt(q['ppl'], '.4f')} "
            f"| {fmt(ll['ppl'], '.4f')} | {fmt(q['median_kld'], '.1e')} / {fmt(q['max_kld'], '.2e')} "
            f"| {fmt(ll['median_kld'], '.6f')} / {fmt(ll['max_kld'], '.6f')} | {tok} "
            f"| {fmt(c['llama_vs_self']['mean_kld'], '.6f')}, {fmt(c['llama_vs_self']['same_top1_pct'], '.3f')} % "
            f"| {fmt(fl.get('mean_kld'), '.1e')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="run.sh's OUTDIR")
    ap.add_argument("models", nargs="+", help="model names (file names without .gguf)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--chunks", default="8")
    ap.add_argument("--llama-args", default="")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    args = ap.parse_args()
    summ = {"backend": args.backend, "threads": args.threads, "chunks": args.chunks,
            "llama_args": args.llama_args,
            "timings": read(args.out / "timings.txt"), "environment": read(args.out / "environment.txt"),
            "models": [model_summary(args.out, m, args.backend) for m in args.models]}
    args.json.write_text(json.dumps(summ, indent=1) + "\n")
    args.md.write_text(markdown(summ))


if __name__ == "__main__":
    main()
