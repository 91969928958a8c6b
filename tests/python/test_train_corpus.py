#!/usr/bin/env python3
"""Invariants of the training corpus of the tiny models (tools/train/corpus.py) that the reported
quality numbers rest on:

  (a) the held-out, validation and training value lists are disjoint (case-insensitive);
  (b) check_heldout fails on a training text that holds a held-out or a validation value (also as
      words inside a longer argument, and as the name of an e-mail address), and passes otherwise;
  (c) documents of every mix pass check_heldout (the phrase mix also for validation values), and the
      held-out arithmetic pairs never appear;
  (d) the phrase mix puts every word of the reserved phrases that its English generator knows ("the",
      "train", "home", ...) inside tool arguments (stage 2 failed where the copy mix had filtered them
      out), never the whole phrases;
  (e) the evaluation sets draw their values from their own reserved lists and are deterministic.

Seeded; prints one line per check; exits 1 on the first failure.
Usage: test_train_corpus.py [--docs N] (the --qwenrt / --tool arguments of the suite are ignored)
"""
from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "train"))

import corpus  # noqa: E402

PARAM = re.compile(r"<parameter=[^>\n]+>\n(.*?)\n</parameter>", re.S)
LISTS = ["CITIES", "CURRENCIES", "STOCKS", "PEOPLE", "LANGUAGES", "PHRASES", "SUBJECTS"]


def fail(msg: str) -> None:
    print(f"FAIL: {msg}")
    sys.exit(1)


def expect_raises(text: str, validation: bool, what: str) -> None:
    try:
        corpus.check_heldout([text], validation=validation)
    except AssertionError:
        return
    fail(f"check_heldout accepted {what}: {text!r}")


def tool_text(name: str, value: str) -> str:
    return f"<tool_call>\n<function=f>\n<parameter={name}>\n{value}\n</parameter>\n</function>\n</tool_call>"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=1500, help="documents generated per mix")
    ap.add_argument("--qwenrt")
    ap.add_argument("--tool")
    args = ap.parse_args()

    # (a) disjoint lists
    topics = [t.strip() for t in corpus.TOPICS]
    train = {v.lower() for n in LISTS for v in getattr(corpus, n)} | {t.lower() for t in topics}
    held = {v.lower() for v in corpus.HELDOUT_VALUES}
    valid = {v.lower() for v in corpus.VALID_VALUES}
    for a, b, what in ((held, valid, "held-out and validation"), (held, train, "held-out and training"),
                       (valid, train, "validation and training")):
        if a & b:
            fail(f"{what} lists share {sorted(a & b)}")
    print(f"lists disjoint: {len(held)} held-out, {len(valid)} validation, {len(train)} training values")

    # (b) the check can fail, and passes on clean text
    for v in ("Regina", "the bus is full", "HKD", "the train is late"):
        expect_raises(tool_text("x", v), True, "a reserved value")
    expect_raises(tool_text("text", "oh the train is late again"), True, "a reserved phrase inside an argument")
    expect_raises(tool_text("to", "soren@work.net"), True, "a reserved name before @")
    expect_raises(tool_text("x", "Nantes"), False, "a held-out value (validation off)")
    a, b = corpus.heldout_pairs()[0]
    expect_raises(f"So {b} + {a} = {a + b}.", False, "a held-out pair")
    corpus.check_heldout([tool_text("x", "the train was late"), tool_text("x", "Regina")], validation=False)
    corpus.check_heldout([tool_text("x", "the train was late"), tool_text("text", "welcome back home")])
    print("check_heldout refuses reserved values and held-out pairs, accepts other text")

    # (c) every mix is clean; (d) the phrase mix copies the words of reserved phrases, not the phrases
    reserved_phrase_words = {w for v in corpus.HELDOUT_VALUES + corpus.VALID_VALUES if " " in v
                             for w in v.lower().split()}
    # words of the reserved phrases that the English generator knows: each must reach an argument
    english = {w for n in ("E_DETS", "E_PRONS", "E_NOUNS", "E_ADJS", "E_VERBS", "E_INTERJ", "E_ADVS", "E_MORE")
               for w in getattr(corpus, n)} | {"is"}
    must = {w for v in corpus.HELDOUT_PHRASES + corpus.VALID_PHRASES for w in v.split()} & english
    for mix in corpus.MIXES:
        texts = [t for _, t in corpus.generate(corpus.SEED + 11, args.docs, mix=mix)]
        corpus.check_heldout(texts, validation=mix not in corpus.MIXES_BEFORE_VALIDATION)
        # (after the system turn: the template's format example there has <parameter=...> blocks too)
        values = [v for t in texts for v in PARAM.findall(t.partition("<|im_start|>user")[2])]
        seen = reserved_phrase_words & {w for v in values for w in v.lower().split()}
        print(f"mix {mix}: {len(texts)} documents, {len(values)} tool arguments clean; "
              f"{len(seen)}/{len(reserved_phrase_words)} words of reserved phrases inside arguments")
    rng, vals = random.Random(corpus.SEED + 12), corpus.ToolValues("phrase")
    drawn = [f(rng) for _ in range(5000) for f in (vals.phrase, vals.subject, vals.topic)]
    words = {w for v in drawn for w in v.split()}
    if must - words:
        fail(f"phrase mix: words of reserved phrases never inside an argument: {sorted(must - words)}")
    if any(corpus._has_reserved(v) for v in drawn):
        fail("phrase mix: a reserved value drawn")
    print(f"phrase mix: all {len(must)} generator words of the reserved phrases drawn in {len(drawn)} values, "
          "no reserved value")

    # (e) evaluation sets
    ev, ev2 = corpus.eval_sets(), corpus.eval_sets()
    if ev != ev2:
        fail("eval_sets() is not deterministic")
    for key, allowed in (("tools", held), ("tools_valid", valid)):
        strings = [str(v).split("@")[0].lower() for c in ev[key] for k, v in c["arguments"].items()
                   if isinstance(v, str) and k not in ("unit", "expression")]
        extra = {s for s in strings if s not in allowed} - {c.lower() for c in corpus.CURRENCIES[:4]}
        if extra:
            fail(f"{key}: values outside its reserved lists: {sorted(extra)[:10]}")
        if len(ev[key]) != corpus.N_HELDOUT_TOOL_CASES:
            fail(f"{key}: {len(ev[key])} cases")
        print(f"{key}: {len(ev[key])} cases, {len(strings)} string values, all from its reserved lists")


if __name__ == "__main__":
    main()
