#!/usr/bin/env python3
"""Evaluate the tiny chat models on the held-out sets of corpus.py.

    python tools/train/eval.py --qwenrt build-train/qwenrt --gguf-dir DIR --hf-dir CKPT --out report.json

Through qwenrt (the C++ binary, greedy):
  arithmetic  `qwenrt run -m M -p "What is A + B?" --temp 0 [--no-think]` for the 200 held-out pairs;
              correct when the last integer of the printed reply (the content; reasoning is not
              printed) equals A + B.
  tools       `qwenrt run -m M --tools TOOLS.json -p USER --temp 0 -n 256 [--no-think]` for each held-out
              case (TOOLS.json: the case's tool definitions; qwenrt renders them with the official
              template, generates greedily and prints each parsed call as `[tool call] NAME(ARGS_JSON)`,
              `[tool call (cut off)] ...` when the reply ended inside it). Correct when the exit code is 0
              and there is exactly one call, complete, with the expected name and arguments (the same
              keys; strings equal exactly, numbers equal numerically, so 250 == 250.0). Sets: tools_*
              draws argument values from reserved lists never used in training, tools_train_values_*
              draws them as training does (new cases, not new values), tools_valid_* (only with --tool-modes)
              from the validation lists used to choose among checkpoints; each with thinking on and off.
              With --tools-teacher-forced the older check runs instead (keys tools_teacher_forced_*):
              the prompt is rendered here (tools/chat/hf_render.py), tokenized with the HF tokenizer,
              and `qwenrt logits` must give the expected token as argmax at every position of the
              expected completion (with thinking on, the corpus's reasoning sentence, then the call,
              then <|im_end|>); `call_given_reasoning` reports the call alone, after that reasoning.
  perplexity  `qwenrt perplexity -m M -f heldout.txt` (chunks of 512 from a fresh state; its default scoring).
Through PyTorch (transformers on the CPU, float32, the HF checkpoint the GGUFs came from):
  mtp         on held-out text, how often the MTP head's top-1 draft for position p+2 (from the trunk's
              hidden state at p and the true token p+1) equals the trunk's greedy token at p+1's
              successor, i.e. argmax of the trunk's logits at p+1; also its plain accuracy.
  perplexity  the same chunking and scoring as qwenrt's, as a cross-check.
"""
import argparse
import concurrent.futures as cf
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402

NAMES = {"qwen35-chat-tiny": False, "qwen35moe-chat-tiny": True}   # stem -> moe
TOOL_MODES = {"think": ("tools", True), "no_think": ("tools", False),             # mode -> (eval set, thinking)
              "train_values_think": ("tools_train_values", True),
              "train_values_no_think": ("tools_train_values", False),
              "valid_think": ("tools_valid", True), "valid_no_think": ("tools_valid", False)}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def last_int(text: str):
    m = re.findall(r"-?\d+", text)
    return int(m[-1]) if m else None


def arithmetic(qwenrt: Path, gguf: Path, pairs, thinking: bool, jobs: int) -> dict:
    def one(p):
        cmd = [str(qwenrt), "run", "-m", str(gguf), "-p", f"What is {p['a']} + {p['b']}?", "--temp", "0",
               "-n", "192"] + ([] if thinking else ["--no-think"])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return {"a": p["a"], "b": p["b"], "reply": r.stdout, "rc": r.returncode,
                "ok": r.returncode == 0 and last_int(r.stdout) == p["answer"]}
    with cf.ThreadPoolExecutor(jobs) as ex:
        res = list(ex.map(one, pairs))
    n_ok = sum(r["ok"] for r in res)
    return {"correct": n_ok, "total": len(res), "accuracy": n_ok / len(res),
            "failures": [r for r in res if not r["ok"]][:20]}


class Tok:
    def __init__(self, hf_dir: Path):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
        self.im_end = self.tok.token_to_id("<|im_end|>")

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


def reply_sequences(tok: Tok, user: list, reply: dict, thinking: bool, tools=None, mark: str | None = None):
    """(prompt ids, full ids through <|im_end|>, index in the full ids where `mark` starts, 0 without one)
    for the conversation `user` answered by `reply`, rendered with the official template."""
    prompt = corpus.render(user, tools=tools, add_generation_prompt=True, enable_thinking=thinking)
    full = corpus.render(user + [reply], tools=tools)
    assert full.startswith(prompt) and full.endswith("<|im_end|>\n"), (prompt, full)
    full = full[:-1]
    p_ids, f_ids = tok.ids(prompt), tok.ids(full)
    assert f_ids[:len(p_ids)] == p_ids and f_ids[-1] == tok.im_end
    return p_ids, f_ids, len(tok.ids(full[:full.index(mark)])) if mark else 0


def tool_sequences(tok: Tok, case: dict, thinking: bool):
    """(prompt ids, full ids through <|im_end|>, index where the call starts) for one held-out case."""
    call = {"type": "function", "function": {"name": case["name"], "arguments": case["arguments"]}}
    reply = {"role": "assistant", "content": "", "tool_calls": [call],
             "reasoning_content": case["reasoning"] if thinking else ""}
    return reply_sequences(tok, [{"role": "user", "content": case["user"]}], reply, thinking, case["tools"],
                           "<tool_call>")


def qwenrt_logits(qwenrt: Path, gguf: Path, ids: list[int]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "x.npy"
        subprocess.run([str(qwenrt), "logits", "-m", str(gguf), "--ids", ",".join(map(str, ids)), "--out", str(out)],
                       check=True, capture_output=True, timeout=600)
        return np.load(out)


def tools_teacher_forced(qwenrt: Path, gguf: Path, tok: Tok, cases, thinking: bool, jobs: int) -> dict:
    def one(case):
        p_ids, f_ids, call_at = tool_sequences(tok, case, thinking)
        logits = qwenrt_logits(qwenrt, gguf, f_ids)
        pred = logits[len(p_ids) - 1:len(f_ids) - 1].argmax(-1)
        want = np.asarray(f_ids[len(p_ids):])
        match = pred == want
        first_bad = int(np.argmin(match)) if not match.all() else None
        return {"name": case["name"], "user": case["user"], "ok": bool(match.all()),
                "call_ok": bool(match[call_at - len(p_ids):].all()), "tokens": len(f_ids),
                "first_mismatch": None if first_bad is None else {
                    "at": first_bad, "want": tok.tok.decode([int(want[first_bad])], skip_special_tokens=False),
                    "got": tok.tok.decode([int(pred[first_bad])], skip_special_tokens=False),
                    "context": tok.tok.decode([int(x) for x in want[max(0, first_bad - 8):first_bad]],
                                              skip_special_tokens=False)}}
    with cf.ThreadPoolExecutor(jobs) as ex:
        res = list(ex.map(one, cases))
    n_ok = sum(r["ok"] for r in res)
    n_call = sum(r["call_ok"] for r in res)
    return {"method": "teacher_forced", "correct": n_ok, "total": len(res), "accuracy": n_ok / len(res),
            "call_given_reasoning": n_call / len(res), "max_tokens": max(r["tokens"] for r in res),
            "failures": [r for r in res if not r["ok"]][:20]}


TOOL_CALL_LINE = re.compile(r"^\[tool call( \(cut off\))?\] (.*?)\((.*)\)$")


def parse_tool_calls(stdout: str) -> list[dict]:
    """The `[tool call] NAME(ARGS_JSON)` lines qwenrt run prints (src/cli/session.cpp), in order."""
    calls = []
    for line in stdout.splitlines():
        m = TOOL_CALL_LINE.match(line)
        if not m:
            continue
        try:
            args = json.loads(m[3])
        except json.JSONDecodeError:
            args = m[3]                     # kept raw; never equals the expected object
        calls.append({"name": m[2], "arguments": args, "complete": m[1] is None})
    return calls


def same_value(want, got) -> bool:
    """JSON equality where numbers compare numerically (250 == 250.0) and bools are not numbers."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(want) is type(got) and want == got
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and want == got
    if isinstance(want, dict):
        return isinstance(got, dict) and want.keys() == got.keys() and all(same_value(want[k], got[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(want) == len(got) and all(map(same_value, want, got))
    return type(want) is type(got) and want == got


def tools_generate(qwenrt: Path, gguf: Path, cases, thinking: bool, jobs: int, max_tokens: int = 256) -> dict:
    """Greedy `qwenrt run --tools` on each case; see the module docstring for what counts as correct."""
    def one(case):
        with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as f:
            json.dump(case["tools"], f, ensure_ascii=False)
        cmd = [str(qwenrt), "run", "-m", str(gguf), "--tools", f.name, "-p", case["user"], "--temp", "0",
               "-n", str(max_tokens)] + ([] if thinking else ["--no-think"])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            rc, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = "timeout", e.stdout or "", e.stderr or ""
            out, err = [x.decode(errors="replace") if isinstance(x, bytes) else x for x in (out, err)]
        finally:
            Path(f.name).unlink(missing_ok=True)
        calls = parse_tool_calls(out)
        ok = (rc == 0 and len(calls) == 1 and calls[0]["complete"] and calls[0]["name"] == case["name"]
              and same_value(case["arguments"], calls[0]["arguments"]))
        finish = re.findall(r"\| (\w+)\]\s*$", err)
        res = {"user": case["user"], "want": {"name": case["name"], "arguments": case["arguments"]},
               "calls": calls, "stdout": out[:400], "rc": rc, "finish": finish[-1] if finish else None, "ok": ok}
        if rc != 0:
            res["stderr"] = err.strip()[-400:]
        return res
    with cf.ThreadPoolExecutor(jobs) as ex:
        res = list(ex.map(one, cases))
    n_ok = sum(r["ok"] for r in res)
    return {"method": "generate", "correct": n_ok, "total": len(res), "accuracy": n_ok / len(res),
            "no_call": sum(not r["calls"] for r in res), "several_calls": sum(len(r["calls"]) > 1 for r in res),
            "right_name": sum(len(r["calls"]) == 1 and r["calls"][0]["name"] == r["want"]["name"] for r in res),
            "failures": [r for r in res if not r["ok"]][:20]}


def qwenrt_perplexity(qwenrt: Path, gguf: Path, text_file: Path, chunks: int) -> dict:
    r = subprocess.run([str(qwenrt), "perplexity", "-m", str(gguf), "-f", str(text_file), "--ctx", "512",
                        "--chunks", str(chunks)],
                       capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    m = re.findall(r"(?i)ppl[^0-9]*([0-9]+\.[0-9]+)", out)
    return {"rc": r.returncode, "ppl": float(m[-1]) if m else None, "output": out.strip()[-600:]}


def torch_eval(hf_dir: Path, moe: bool, tok: Tok, prose_text: str, prose_chats: list[str], ctx: int,
               chunks: int) -> dict:
    import torch
    import tiny_models
    torch.set_num_threads(2)
    model, mtp = tiny_models.load(hf_dir, moe)
    emb = model.model.embed_tokens

    def run(ids):
        x = torch.tensor([ids])
        with torch.no_grad():
            h = model.model(input_ids=x).last_hidden_state
            logits = model.lm_head(h)[0]
            e = emb(x[:, 1:])
            hm = mtp(e, h[:, :-1], tiny_models.position_embeddings(model, e))
            lm = model.lm_head(hm)[0]
        return logits, lm

    # perplexity: chunks of ctx tokens from a fresh state; score the second half (llama.cpp's default)
    ids = tok.ids(prose_text)
    nll, n = 0.0, 0
    agree, acc, total = 0, 0, 0
    for s in range(0, min(len(ids) - ctx + 1, chunks * ctx), ctx):
        chunk = ids[s:s + ctx]
        logits, lm = run(chunk)
        lp = torch.log_softmax(logits.float(), -1)
        half = ctx // 2
        tgt = torch.tensor(chunk[half + 1:])
        nll -= float(lp[half:-1].gather(1, tgt[:, None]).sum())
        n += len(tgt)
        g = logits.argmax(-1)               # trunk greedy token for position p+1 is g[p]
        d = lm.argmax(-1)                   # MTP draft at p (predicts token p+2)
        m = len(chunk) - 2
        agree += int((d[:m] == g[1:m + 1]).sum())
        acc += int((d[:m] == torch.tensor(chunk[2:])).sum())
        total += m
    chat_agree, chat_total = 0, 0
    for text in prose_chats:
        cids = tok.ids(text)[:ctx]
        logits, lm = run(cids)
        g, d = logits.argmax(-1), lm.argmax(-1)
        m = len(cids) - 2
        chat_agree += int((d[:m] == g[1:m + 1]).sum())
        chat_total += m
    out = {"ppl": math.exp(nll / n), "ppl_scored_tokens": n,
           "mtp_agree": agree / total, "mtp_accuracy": acc / total, "mtp_positions": total}
    if chat_total:
        out |= {"mtp_agree_docstring_chats": chat_agree / chat_total, "mtp_positions_docstring_chats": chat_total}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwenrt", type=Path, default=HERE.parents[1] / "build-train/qwenrt")
    ap.add_argument("--gguf-dir", type=Path, required=True)
    ap.add_argument("--hf-dir", type=Path, help="folder with dense/hf and moe/hf (for torch and --tools-teacher-forced)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--files", nargs="*", default=["qwen35-chat-tiny.Q8_0", "qwen35-chat-tiny.Q4_K_M",
                                                    "qwen35moe-chat-tiny.Q4_K_M"])
    ap.add_argument("--ppl-files", nargs="*", default=None, help="GGUF stems for perplexity (default: all six)")
    ap.add_argument("--n-arith", type=int, default=200)
    ap.add_argument("--n-tools", type=int, default=100, help="first N cases of each tool set")
    ap.add_argument("--tool-max-tokens", type=int, default=256, help="qwenrt run -n for the tool cases")
    ap.add_argument("--tools-teacher-forced", action="store_true",
                    help="tools by teacher forcing through qwenrt logits (keys tools_teacher_forced_*) "
                         "instead of greedy qwenrt run --tools")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ppl-chunks", type=int, default=8)
    ap.add_argument("--mtp-chats", type=int, default=40, help="held-out docstring chats for MTP agreement")
    ap.add_argument("--tool-modes", nargs="*", default=list(TOOL_MODES), choices=list(TOOL_MODES) + ["train_values"],
                    help="tool sets: think, no_think (reserved held-out values), train_values_think, "
                         "train_values_no_think (values as training draws them), valid_think, valid_no_think "
                         "(validation values, for choosing checkpoints); train_values = train_values_no_think")
    ap.add_argument("--skip", nargs="*", default=[], help="sections to skip: arithmetic tools ppl torch")
    args = ap.parse_args()
    if args.hf_dir is None and ("torch" not in args.skip or (args.tools_teacher_forced and "tools" not in args.skip)):
        ap.error("--hf-dir is needed for the torch section and for --tools-teacher-forced")
    tool_modes = list(dict.fromkeys("train_values_no_think" if m == "train_values" else m for m in args.tool_modes))

    ev = corpus.eval_sets()
    report = json.loads(args.out.read_text()) if args.out.is_file() else {}
    report["note"] = __doc__.split("\n\n", 2)[2].strip()

    def save():
        args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")

    texts = {"stories": args.out.with_name("heldout-stories.txt"), "prose": args.out.with_name("heldout-prose.txt")}
    texts["stories"].write_text(ev["story_text"], encoding="utf-8")
    texts["prose"].write_text(ev["prose_text"], encoding="utf-8")
    for stem in args.files:
        gguf = args.gguf_dir / f"{stem}.gguf"
        moe = stem.startswith("qwen35moe")
        entry = report.setdefault(stem, {})
        if "arithmetic" not in args.skip:
            for thinking in (True, False):
                key = f"arithmetic_{'think' if thinking else 'no_think'}"
                log(f"{stem}: {key}")
                entry[key] = arithmetic(args.qwenrt, gguf, ev["arithmetic"][:args.n_arith], thinking, args.jobs)
                log(f"  {entry[key]['correct']}/{entry[key]['total']}")
                save()
        if "tools" not in args.skip:
            tok = Tok(args.hf_dir / ("moe" if moe else "dense") / "hf") if args.tools_teacher_forced else None
            for mode in tool_modes:
                cases, thinking = TOOL_MODES[mode]
                cases = ev[cases][:args.n_tools]
                key = f"tools_{'teacher_forced_' if tok else ''}{mode}"
                log(f"{stem}: {key} ({len(cases)} cases)")
                t0 = time.time()
                if tok:
                    entry[key] = r = tools_teacher_forced(args.qwenrt, gguf, tok, cases, thinking, args.jobs)
                else:
                    entry[key] = r = tools_generate(args.qwenrt, gguf, cases, thinking, args.jobs,
                                                    args.tool_max_tokens)
                r["seconds"] = round(time.time() - t0, 1)
                log(f"  {r['correct']}/{r['total']} in {r['seconds']} s" + (
                    f" (call given reasoning {r['call_given_reasoning']:.2f})" if tok else
                    f" (right name {r['right_name']}, no call {r['no_call']}, several {r['several_calls']})"))
                save()
    if "ppl" not in args.skip:
        stems = args.ppl_files if args.ppl_files is not None else [
            f"{n}.{q}" for n in NAMES for q in ("F16", "Q8_0", "Q4_K_M")]
        for stem in stems:
            for name, path in texts.items():
                if name == "prose" and stem.startswith("qwen35moe"):
                    continue
                log(f"{stem}: qwenrt perplexity on held-out {name} text")
                report.setdefault(stem, {})[f"perplexity_qwenrt_{name}"] = r = qwenrt_perplexity(
                    args.qwenrt, args.gguf_dir / f"{stem}.gguf", path, args.ppl_chunks)
                log(f"  {r['ppl']}")
                save()
    if "torch" not in args.skip:
        for name, moe in NAMES.items():
            log(f"{name}: transformers (CPU, fp32) perplexity and MTP")
            hf = args.hf_dir / ("moe" if moe else "dense") / "hf"
            chats = ev["prose_chats"][:args.mtp_chats]
            report.setdefault(name, {})["torch"] = {
                "chat": torch_eval(hf, moe, Tok(hf), ev["chat_text"], chats, 512, args.ppl_chunks),
                "prose": torch_eval(hf, moe, Tok(hf), ev["prose_text"], [], 512, args.ppl_chunks)}
            log(f"  {report[name]['torch']}")
            save()


if __name__ == "__main__":
    main()
