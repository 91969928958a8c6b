#!/usr/bin/env python3
"""Fast teacher-forced check of a trained checkpoint in PyTorch (for picking among training runs on the
GPU machine; the reported numbers come from tools/train/eval.py through qwenrt).

    python tools/train/quick_eval.py --hf OUT/dense/hf --data build-train-copy [--moe] [--out r.json]

For each held-out case the whole expected reply is rendered with the official template and run through
the model once: the case passes when the argmax at every position of the reply is the expected token,
through <|im_end|> (what greedy decoding would print, token for token).
  tools       the 100 held-out tool cases (argument values from reserved lists; with --tool-sets also
              the 100 validation cases (tools_valid: their own reserved lists, for choosing runs) and
              the 100 new cases with values drawn as stage 1 draws them), thinking on and off; with
              thinking on the reply holds the corpus's reasoning sentence, `call` counts the call alone
  arithmetic  the 200 held-out pairs "What is A + B?", thinking on (the digit-by-digit working) and off
"""
import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import eval as tiny_eval  # noqa: E402  (tools/train/eval.py)
import tiny_models  # noqa: E402


def score(model, sequences, dev):
    """(reply ok, ok from the mark on) under teacher forcing, for eval.reply_sequences' output."""
    p_ids, f_ids, mark_at = sequences
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([f_ids], device=dev)).logits[0]
    pred = logits[len(p_ids) - 1:len(f_ids) - 1].argmax(-1).cpu()
    match = pred == torch.tensor(f_ids[len(p_ids):])
    return bool(match.all()), bool(match[max(mark_at - len(p_ids), 0):].all())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True, help="a make_data.py folder (eval.json, tokenizer/)")
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tool-sets", nargs="+", default=["tools"], choices=["tools", "tools_train_values", "tools_valid"],
                    help="eval.json tool sets: held-out values (tools), validation values (tools_valid), values "
                    "drawn as stage 1 draws them (tools_train_values)")
    ap.add_argument("--no-arithmetic", action="store_true")
    args = ap.parse_args()
    tok = tiny_eval.Tok(args.data / "tokenizer")
    ev = json.loads((args.data / "eval.json").read_text(encoding="utf-8"))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = tiny_models.load(args.hf, args.moe)
    model.to(dev)
    report = {"hf": str(args.hf)}
    for thinking in (True, False):
        mode = "think" if thinking else "nothink"
        for key in args.tool_sets:
            ok = call = 0
            for c in ev[key]:
                a, b = score(model, tiny_eval.tool_sequences(tok, c, thinking), dev)
                ok += a
                call += b
            report[f"{key}_{mode}"] = {"ok": ok, "call": call, "total": len(ev[key])}
        if args.no_arithmetic:
            continue
        ok = 0
        for p in ev["arithmetic"]:
            a, b = p["a"], p["b"]
            reply = {"role": "assistant", "content": f"{a} + {b} = {a + b}.",
                     "reasoning_content": corpus.add_working(a, b) if thinking else ""}
            seq = tiny_eval.reply_sequences(tok, [{"role": "user", "content": p["prompt"]}], reply, thinking)
            ok += score(model, seq, dev)[0]
        report[f"arith_{mode}"] = {"ok": ok, "total": len(ev["arithmetic"])}
    print(json.dumps(report), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
