#!/usr/bin/env python3
"""Prefix cache benchmark (issue 16): agent-style conversations with tool results replayed turn by
turn against `qwenrt serve` (prefix cache on and off) and llama.cpp's `llama-server` (its own
prompt cache on), counting the tokens each turn prefills and its time to first token.

    LLAMACPP_SERVER=1 bash bench/build_llamacpp.sh           # llama-server from the pinned sdist
    .venv/bin/python bench/prefix_cache.py --out bench/results/prefix-cache.md \\
        --json bench/results/prefix-cache.json

Target (issue 16): after each conversation's first turn, at most the new turn's tokens plus one
page (64 tokens) are prefilled, every turn, in every workload.

Conversations (deterministic: seeded by --seed and the conversation's number): a system prompt
and three tools (read_file, run_shell, search; OpenAI `tools` JSON schemas), a user task, then an
agent loop. Turn t's request is the history so far; what it appends to the history for turn t+1
is, with --history scripted (the default), a fixed assistant message with one tool call and the
`tool` message with its result (a few hundred characters of file text, build output or search
hits), so the history is the same on every server and every run; the request's own reply
(--max-tokens, greedy, thinking off, the stop tokens banned so every reply has the same length)
only costs decode time. --history model appends the model's actual reply instead (its content and
tool calls, then a scripted tool result): the histories then differ between servers.
--user-every N puts a new user message in the history every N turns: Qwen3.5's chat template
then renders every earlier assistant turn without its empty think block, so the prompt stops
being an extension of the previous one (the "reusable" column shows it).

Workloads (each on a fresh server process):
  single       one conversation of --turns turns, one request at a time;
  interleaved  --conversations conversations (more than --parallel), turn by turn: turn 1 of
               each, then turn 2 of each, ..., one request at a time;
  concurrent   the same conversations and order, but each round's requests sent at once (they
               queue for the slots; TTFT includes the wait).

Per request: prompt tokens (usage.prompt_tokens); cached (usage.prompt_tokens_details.
cached_tokens, 0 when absent); prefilled = llama-server's timings.prompt_n, else prompt -
cached; new = this turn's prompt tokens - the previous turn's of the same conversation; reusable
= the longest common prefix of this turn's and the previous turn's prompt token ids (rendered
with `qwenrt template` and `qwenrt tokenize`, scripted history only), so prompt - reusable is
what an exact prefix cache must prefill at least; TTFT = request sent -> first delta that carries
generated output (content, reasoning or a tool call; the role-only first chunk does not count);
total = request sent -> end of the stream.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import hashlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_load as sl  # noqa: E402  (its HTTP client, server processes and recording helpers)

REPO = sl.REPO
PAGE = 64  # tokens: one KV page, the slack the target allows

# ---------------------------------------------------------------------------------------------
# conversations

SYSTEM = ("You are a coding agent working in a C++20 repository (an inference engine and its HTTP "
          "server). Use the tools to read files, run shell commands and search the code before "
          "you answer; keep each step short and call one tool at a time.")

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the repository root"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the repository root and "
        "return its output (stdout and stderr, cut at 4 KiB).",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line"}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the repository's files for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "The regular expression"}},
            "required": ["query"]}}},
]

MODULES = ["serve", "gen", "ops", "model", "chat", "tokenizer", "gguf", "util"]
FILES = ["scheduler", "kv_pages", "sampler", "stream", "openai", "loader", "parse", "turn",
         "bpe", "reader", "status", "metrics"]
IDENTS = ["slot", "page", "seq", "tokens", "prompt", "state", "budget", "queue", "reply",
          "offset", "length", "hash", "block", "prefix", "batch", "ctx", "step", "cursor"]
TASKS = ["the server answers 500 when a request has an empty messages array",
         "a streamed reply sometimes ends without finish_reason",
         "the scheduler admits one sequence more than --parallel",
         "the tokenizer splits numbers differently from the reference",
         "a tool call with a nested object argument is parsed as a string",
         "/metrics reports KV pages in use after every sequence has ended",
         "a long prompt is cut at the context size without a 400",
         "the GGUF loader accepts a tensor with the wrong shape"]
SHELL = ["cmake --build build -j2 --target qwenrt", "ctest --test-dir build -R serve",
         "git log --oneline -5 -- src/{m}", "grep -rn '{i}_{j}' src/{m} | head",
         "build/qwenrt info models/tiny.gguf", "tools/test.sh -R {f}"]


def ident(rng: random.Random) -> str:
    return f"{rng.choice(IDENTS)}_{rng.choice(IDENTS)}"


def code_text(rng: random.Random, path: str, chars: int) -> str:
    lines = [f"// {path}", "#include \"util/status.h\"", ""]
    n = rng.randint(10, 200)
    while sum(len(l) + 1 for l in lines) < chars:
        a, b, c = ident(rng), ident(rng), ident(rng)
        n += 1
        lines.append(rng.choice([
            f"int {a}(const {b.title()}& {c}) {{ return {c}.{rng.choice(IDENTS)} + {n}; }}",
            f"  if ({a} >= {b}) return Status::error(\"{a}: {n} > {b}\");",
            f"  for (int i = 0; i < {a}; ++i) {b}[i] = {c}(i);",
            f"// {a} is kept per {rng.choice(IDENTS)}: see {rng.choice(FILES)}.cpp",
            f"  {a} = std::min({b}, {c} + {n});"]))
    return "\n".join(lines)


def shell_text(rng: random.Random, command: str, chars: int) -> str:
    lines = [f"$ {command}"]
    n = 0
    while sum(len(l) + 1 for l in lines) < chars:
        n += 1
        m, f = rng.choice(MODULES), rng.choice(FILES)
        lines.append(rng.choice([
            f"[{n}/{rng.randint(n, 90)}] Building CXX object src/{m}/CMakeFiles/{m}.dir/{f}.cpp.o",
            f"src/{m}/{f}.cpp:{rng.randint(10, 900)}:{rng.randint(1, 60)}: warning: unused "
            f"variable '{ident(rng)}'",
            f"[ RUN      ] {m.title()}Test.{ident(rng)}",
            f"[       OK ] {m.title()}Test.{ident(rng)} ({rng.randint(0, 90)} ms)",
            f"{rng.randint(1, 40)} tests passed, {rng.randint(0, 2)} failed out of "
            f"{rng.randint(40, 80)}"]))
    return "\n".join(lines)


def search_text(rng: random.Random, query: str, chars: int) -> str:
    lines = []
    while sum(len(l) + 1 for l in lines) < chars:
        m, f, a = rng.choice(MODULES), rng.choice(FILES), ident(rng)
        lines.append(f"src/{m}/{f}.cpp:{rng.randint(10, 900)}:  {a} = {query}({ident(rng)});")
    return "\n".join(lines)


class Conversation:
    """One agent conversation: the scripted steps are drawn from an rng seeded by (seed, number),
    so the same number gives the same conversation on every server and every run."""

    def __init__(self, number: int, a):
        self.number = number
        self.rng = random.Random(f"prefix-cache:{a.seed}:{number}")
        self.a = a
        m, f = self.rng.choice(MODULES), self.rng.choice(FILES)
        self.messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Conversation {number}: {self.rng.choice(TASKS)}. The "
             f"likely place is src/{m}/{f}.cpp. Find the cause, fix it and run the tests."}]

    def tool_step(self, turn: int, call: dict | None = None) -> list[dict]:
        """The assistant's tool call (scripted unless `call` came from the model) and its
        result."""
        rng = self.rng
        chars = rng.randint(self.a.result_chars[0], self.a.result_chars[1])
        m, f = rng.choice(MODULES), rng.choice(FILES)
        if call is None:
            name = rng.choice(["read_file", "read_file", "run_shell", "search"])
            if name == "read_file":
                args = {"path": f"src/{m}/{f}.cpp"}
            elif name == "run_shell":
                args = {"command": rng.choice(SHELL).format(m=m, f=f, i=rng.choice(IDENTS),
                                                              j=rng.choice(IDENTS))}
            else:
                args = {"query": ident(rng)}
            call = {"id": f"call_{self.number}_{turn}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)}}
            says = rng.choice(["", "", "", f"Next I check {args[next(iter(args))]}."])
            out = [{"role": "assistant", "content": says, "tool_calls": [call]}]
        else:
            out = []
        name = call["function"].get("name", "")
        try:
            args = json.loads(call["function"].get("arguments") or "{}")
        except ValueError:
            args = {}
        if not isinstance(args, dict):
            args = {}
        if name == "run_shell":
            result = shell_text(rng, str(args.get("command", "make")), chars)
        elif name == "search":
            result = search_text(rng, str(args.get("query", ident(rng))), chars)
        else:
            result = code_text(rng, str(args.get("path", f"src/{m}/{f}.cpp")), chars)
        out.append({"role": "tool", "tool_call_id": call.get("id") or f"call_{self.number}_{turn}",
                    "content": result})
        return out

    def user_step(self, turn: int) -> list[dict]:
        rng = self.rng
        return [{"role": "assistant", "content": f"I changed {ident(rng)} in src/"
                 f"{rng.choice(MODULES)}/{rng.choice(FILES)}.cpp; the tests pass."},
                {"role": "user", "content": f"Good. Now also check {ident(rng)} in the same way "
                 f"(step {turn})."}]

    def advance(self, turn: int, reply: dict | None):
        """Append what goes into the history after `turn`'s request (for turn + 1)."""
        if self.a.user_every and turn % self.a.user_every == 0:
            self.messages += self.user_step(turn + 1)
        elif self.a.history == "model" and reply is not None:
            calls = reply.get("tool_calls") or []
            self.messages.append({"role": "assistant", "content": reply.get("content") or "",
                                  **({"tool_calls": calls} if calls else {})})
            self.messages += self.tool_step(turn + 1, calls[0] if calls else
                                            {"id": f"call_{self.number}_{turn + 1}",
                                             "function": {"name": "read_file"}})
        else:
            self.messages += self.tool_step(turn + 1)


def render_tokens(a, messages: list[dict]) -> list[int]:
    """The prompt's token ids as qwenrt renders it (chat template, thinking off) and tokenizes
    it."""
    with tempfile.TemporaryDirectory(prefix="prefix-cache-") as d:
        mp, tp = Path(d) / "messages.json", Path(d) / "tools.json"
        mp.write_text(json.dumps(messages))
        tp.write_text(json.dumps(TOOLS))
        text = subprocess.run([str(a.qwenrt), "template", "-m", str(a.model), "--messages",
                               str(mp), "--tools", str(tp), "--no-think"], check=True,
                              capture_output=True, text=True).stdout
    ids = subprocess.run([str(a.qwenrt), "tokenize", "-m", str(a.model), "--special", text],
                         check=True, capture_output=True, text=True).stdout.split()
    return [int(x) for x in ids]


def common_prefix(x: list[int], y: list[int]) -> int:
    n = 0
    for p, q in zip(x, y):
        if p != q:
            break
        n += 1
    return n


def scripted_renders(a, numbers: list[int]) -> dict:
    """Per conversation: rendered token counts and the common prefix with the previous turn."""
    out = {}
    for n in numbers:
        conv, prev, rows = Conversation(n, a), None, []
        for turn in range(1, a.turns + 1):
            ids = render_tokens(a, conv.messages)
            rows.append({"tokens": len(ids),
                         "reusable": common_prefix(prev, ids) if prev is not None else 0})
            prev = ids
            conv.advance(turn, None)
        out[n] = rows
    return out


# ---------------------------------------------------------------------------------------------
# requests


def turn_body(a, conv: Conversation, stops: list[int]) -> dict:
    b = {"model": "m", "messages": conv.messages, "tools": TOOLS, "temperature": 0,
         "max_tokens": a.max_tokens, "stream": True, "stream_options": {"include_usage": True},
         "chat_template_kwargs": {"enable_thinking": False}}
    if a.history == "scripted":
        # Every reply max_tokens long, on both servers: the decode cost is the same every turn.
        b["logit_bias"] = {str(t): -100 for t in stops}
    return b


class TurnEvents:
    """What a turn's stream carried besides content deltas: usage, llama-server's timings, tool
    call fragments, the first delta of generated output."""

    def __init__(self):
        self.usage, self.timings, self.t_generated = None, None, None
        self.calls: dict[int, dict] = {}
        self.reasoning = ""

    def __call__(self, j: dict, now: float):
        if j.get("usage"):
            self.usage = j["usage"]
        if j.get("timings"):
            self.timings = j["timings"]
        for ch in j.get("choices") or []:
            d = ch.get("delta") or {}
            if d.get("content") or d.get("reasoning_content") or d.get("tool_calls"):
                if self.t_generated is None:
                    self.t_generated = now
            self.reasoning += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                c = self.calls.setdefault(tc.get("index", 0), {"id": "", "type": "function",
                                                              "function": {"name": "",
                                                                           "arguments": ""}})
                c["id"] = tc.get("id") or c["id"]
                fn = tc.get("function") or {}
                c["function"]["name"] += fn.get("name") or ""
                c["function"]["arguments"] += fn.get("arguments") or ""


async def one_turn(srv: sl.ServerProc, a, conv: Conversation, turn: int, stops, t0: float,
                   prev_prompt: int | None) -> dict:
    ev = TurnEvents()
    r = await sl.exchange(srv.port, "/v1/chat/completions", turn_body(a, conv, stops), True,
                          on_event=ev)
    t_end = time.perf_counter()
    u = ev.usage or {}
    prompt = u.get("prompt_tokens")
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    if ev.timings is not None and "prompt_n" in ev.timings:
        prefilled = ev.timings["prompt_n"]
    elif prompt is not None:
        prefilled = prompt - (cached or 0)
    else:
        prefilled = None
    new = prompt - prev_prompt if prompt is not None and prev_prompt is not None else None
    rec = {"conversation": conv.number, "turn": turn, "status": r.status, "error": r.error,
           "prompt_tokens": prompt, "cached_tokens": cached, "prefilled": prefilled,
           "new_tokens": new, "completion_tokens": u.get("completion_tokens"),
           "timings": ev.timings, "finish_reason": r.finish_reason, "done": r.done,
           "sent_s": round(r.t_sent - t0, 4),
           "ttft_ms": round((ev.t_generated - r.t_sent) * 1e3, 1) if ev.t_generated else None,
           "total_ms": round((t_end - r.t_sent) * 1e3, 1), "reply": r.text,
           "tool_calls": [ev.calls[k] for k in sorted(ev.calls)],
           "body": r.body[-300:].decode(errors="replace") if r.status != 200 else ""}
    rec["target_met"] = (prefilled <= new + PAGE) if (turn > 1 and prefilled is not None
                                                     and new is not None) else None
    return rec


async def run_workload(srv: sl.ServerProc, a, kind: str, numbers: list[int], stops) -> dict:
    convs = {n: Conversation(n, a) for n in numbers}
    prev: dict[int, int | None] = {n: None for n in numbers}
    recs = []
    t0 = time.perf_counter()
    with sl.RssSampler(srv.proc.pid) as rss:
        for turn in range(1, a.turns + 1):
            if kind == "concurrent":
                got = await asyncio.gather(*[one_turn(srv, a, convs[n], turn, stops, t0, prev[n])
                                             for n in numbers])
            else:
                got = [await one_turn(srv, a, convs[n], turn, stops, t0, prev[n])
                       for n in numbers]
            for rec in got:
                n = rec["conversation"]
                prev[n] = rec["prompt_tokens"] if rec["prompt_tokens"] is not None else prev[n]
                reply = {"content": rec["reply"], "tool_calls": rec["tool_calls"]}
                convs[n].advance(turn, reply)
                recs.append(rec)
            last = got[-1]
            print(f"  {srv.kind} {kind} turn {turn}: prompt {[g['prompt_tokens'] for g in got]} "
                  f"prefilled {[g['prefilled'] for g in got]} ttft "
                  f"{[round(g['ttft_ms'] or -1) for g in got]} ms", flush=True)
            if last["status"] != 200:
                print(f"    status {last['status']}: {last['error']} {last['body']}", flush=True)
    return {"records": recs, "wall_s": time.perf_counter() - t0,
            "rss_idle": rss.samples[0] if rss.samples else None,
            "rss_peak": max(rss.samples) if rss.samples else None}


# ---------------------------------------------------------------------------------------------
# servers


def qwenrt_has_prefix_cache(a) -> bool:
    out = subprocess.run([str(a.qwenrt), "serve", "--help"], capture_output=True, text=True)
    return "--prefix-cache" in out.stdout + out.stderr


def server_plans(a, port_of) -> list[tuple[str, str, list[str]]]:
    """(label, kind, command) per server configuration, in run order."""
    plans = []
    if a.prefix_cache_flag:
        budgets = []
        for flag, v in (("--cache-kv-mb", a.cache_kv_mb), ("--cache-state-mb", a.cache_state_mb),
                        ("--cache-host-mb", a.cache_host_mb)):
            if v is not None:
                budgets += [flag, str(v)]
        plans.append(("qwenrt cache on", "qwenrt",
                      sl.qwenrt_cmd(a, port_of(), a.queue) + ["--prefix-cache", "on", *budgets]))
        plans.append(("qwenrt cache off", "qwenrt",
                      sl.qwenrt_cmd(a, port_of(), a.queue) + ["--prefix-cache", "off"]))
    else:
        plans.append(("qwenrt (no prefix cache in this build)", "qwenrt",
                      sl.qwenrt_cmd(a, port_of(), a.queue)))
    if not a.skip_llamacpp:
        plans.append(("llama-server (prompt cache on)", "llama-server",
                      sl.llama_cmd(a, port_of()) + list(a.llama_arg or [])))
    return plans


def workload_numbers(a, kind: str) -> list[int]:
    # Conversation 0 for the single one, 1..K for the interleaved ones (the same K conversations
    # in both interleaved workloads: each workload runs on a fresh server).
    return [0] if kind == "single" else list(range(1, a.conversations + 1))


async def main_async(a) -> dict:
    t_start = time.perf_counter()
    res = {"started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "load_before": sl.loadavg(), "cmds": {}, "runs": {}, "startup_s": {}, "rc": {}}
    stops = sl.stop_ids(a)
    res["stops"] = stops
    if a.history == "scripted":
        numbers = sorted({n for k in a.workloads for n in workload_numbers(a, k)})
        t = time.perf_counter()
        res["renders"] = scripted_renders(a, numbers)
        print(f"rendered {len(numbers)} conversations in {time.perf_counter() - t:.1f}s; last "
              f"turns' tokens {[res['renders'][n][-1]['tokens'] for n in numbers]}", flush=True)
    plans = server_plans(a, sl.free_port)
    res["labels"] = [p[0] for p in plans]
    for label, kind, cmd in plans:
        res["cmds"][label] = sl.shown_cmd([str(a.qwenrt_orig) if c == str(a.qwenrt) else c
                                           for c in cmd])
        res["runs"][label] = {}
        for wl in a.workloads:
            port = int(cmd[cmd.index("--port") + 1])
            srv = sl.ServerProc(kind, cmd, port)
            try:
                await srv.wait_healthy()
                res["startup_s"].setdefault(label, []).append(srv.startup_s)
                # Warm-up (page faults, first-call allocations): no tools and another system
                # prompt, so it shares no prefix with the conversations beyond the chat markup.
                await sl.exchange(port, "/v1/chat/completions", sl.chat_body(0, a, stops), True)
                print(f"{label}: {wl}", flush=True)
                res["runs"][label][wl] = await run_workload(srv, a, wl, workload_numbers(a, wl),
                                                            stops)
            except SystemExit as e:
                res["runs"][label][wl] = {"failed": str(e)[-1500:], "records": []}
                print(f"{label} FAILED: {e}", flush=True)
            finally:
                res["rc"].setdefault(label, []).append(srv.stop())
                res["runs"][label][wl]["log_tail"] = srv.output()[-1500:]
            # A fresh port for the next process (the old one may sit in TIME_WAIT).
            cmd[cmd.index("--port") + 1] = str(sl.free_port())
    res["load_after"] = sl.loadavg()
    res["elapsed_s"] = time.perf_counter() - t_start
    res["checks"] = checks(a, res)
    return res


# ---------------------------------------------------------------------------------------------
# checks and report


def checks(a, res: dict) -> list[str]:
    """Problems found; an empty list when every check holds."""
    bad = []
    for label in res["labels"]:
        for wl, run in res["runs"][label].items():
            if "failed" in run:
                bad.append(f"{label} / {wl}: server failed: {run['failed'][:300]}")
            by_conv: dict[int, list[dict]] = {}
            for r in run["records"]:
                by_conv.setdefault(r["conversation"], []).append(r)
                where = f"{label} / {wl} / conversation {r['conversation']} turn {r['turn']}"
                if r["status"] != 200 or r["error"]:
                    bad.append(f"{where}: status {r['status']} {r['error'] or ''} {r['body']}")
                elif not (r["completion_tokens"] or r["reply"] or r["tool_calls"]) or \
                        not r["done"] or r["prompt_tokens"] is None:
                    bad.append(f"{where}: empty or incomplete reply (completion_tokens "
                               f"{r['completion_tokens']}, [DONE] {r['done']}, usage "
                               f"{'yes' if r['prompt_tokens'] is not None else 'no'})")
                t = r["timings"]
                if t and r["prompt_tokens"] is not None and \
                        t.get("prompt_n", 0) + t.get("cache_n", 0) != r["prompt_tokens"]:
                    bad.append(f"{where}: timings prompt_n {t.get('prompt_n')} + cache_n "
                               f"{t.get('cache_n')} != prompt_tokens {r['prompt_tokens']}")
                if r["prompt_tokens"] is not None and \
                        r["prompt_tokens"] + a.max_tokens > a.ctx:
                    bad.append(f"{where}: prompt {r['prompt_tokens']} + max_tokens "
                               f"{a.max_tokens} exceeds the context {a.ctx}")
                rend = (res.get("renders") or {}).get(r["conversation"])
                if rend and r["prompt_tokens"] is not None and \
                        rend[r["turn"] - 1]["tokens"] != r["prompt_tokens"]:
                    bad.append(f"{where}: prompt_tokens {r['prompt_tokens']}, qwenrt template + "
                               f"tokenize gives {rend[r['turn'] - 1]['tokens']}")
            for n, rs in by_conv.items():
                ps = [r["prompt_tokens"] for r in sorted(rs, key=lambda r: r["turn"])]
                if any(p is None or q is None or q <= p for p, q in zip(ps, ps[1:])):
                    bad.append(f"{label} / {wl} / conversation {n}: prompt_tokens do not "
                               f"strictly increase: {ps}")
    if a.history == "scripted" and len(res["labels"]) > 1:
        first = res["labels"][0]
        for label in res["labels"][1:]:
            for wl in a.workloads:
                mine = {(r["conversation"], r["turn"]): r["prompt_tokens"]
                        for r in res["runs"][label].get(wl, {}).get("records", [])}
                for r in res["runs"][first].get(wl, {}).get("records", []):
                    k = (r["conversation"], r["turn"])
                    if k in mine and mine[k] != r["prompt_tokens"]:
                        bad.append(f"{wl} / conversation {k[0]} turn {k[1]}: prompt_tokens "
                                   f"{r['prompt_tokens']} on {first}, {mine[k]} on {label}")
    return bad


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=0) -> str:
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def summary(run: dict) -> dict:
    rs = run["records"]
    later = [r for r in rs if r["turn"] > 1]
    return {"met": sum(1 for r in later if r["target_met"]), "of": len(later),
            "ttft_med": median([r["ttft_ms"] for r in later]),
            "ttft_first_med": median([r["ttft_ms"] for r in rs if r["turn"] == 1]),
            "prefilled": sum(r["prefilled"] or 0 for r in rs),
            "prompt": sum(r["prompt_tokens"] or 0 for r in rs),
            "worst_excess": max((r["prefilled"] - r["new_tokens"] for r in later
                                 if r["prefilled"] is not None and r["new_tokens"] is not None),
                                default=None)}


WORKLOAD_TEXT = {
    "single": "one conversation, one request at a time",
    "interleaved": "{k} conversations interleaved turn by turn (turn 1 of each, then turn 2 of "
                   "each, ...), one request at a time, {p} slots",
    "concurrent": "the same {k} conversations, each round's {k} requests sent at once ({p} "
                  "slots: TTFT includes the wait for one)",
}


def report(a, res: dict, argv: list[str]) -> str:
    L = ["# Prefix cache: tokens prefilled per turn (issue 16)", ""]
    L.append(f"Command: `{sl.shown_cmd(argv)}`  ")
    L.append(f"Run: {res['started']}; machine: {sl.cpu_name()}, {os.cpu_count()} logical CPUs, "
             f"cpu backend, {a.threads} thread(s) per server; load average (1/5/15 min) before "
             f"{res['load_before']}, after {res['load_after']}.  ")
    L.append(f"qwenrt: `{sl.shown(a.qwenrt_orig)}` (binary written "
             f"{a.qwenrt_built:%Y-%m-%d %H:%M} UTC, sha256 {a.qwenrt_sha}, copied when the run "
             f"started so that a rebuild "
             f"during the run does not change it), working tree at git {a.git_rev}; "
             + ("`serve --help` lists `--prefix-cache`.  " if a.prefix_cache_flag else
                "`serve --help` has no `--prefix-cache`: **this is the baseline before the "
                "prefix cache** (it reports `cached_tokens` 0, so every turn prefills its whole "
                "prompt).  "))
    if not a.skip_llamacpp:
        L.append(f"llama.cpp: llama-server from the llama-cpp-python 0.3.36 sdist "
                 f"(`{sl.llama_version(a.llama_server)}`), its prompt cache at its defaults "
                 f"(`cache_prompt` true, `--cache-ram` 8192 MiB, context checkpoints 32 per "
                 f"slot); extra flags: `{' '.join(a.llama_arg or []) or 'none'}`.  ")
    L.append(f"Model: `{sl.shown(a.model)}`; {a.parallel} slots, {a.ctx} tokens of context per "
             f"slot on every server; {a.turns} turns per conversation; history "
             f"{a.history}; replies {a.max_tokens} tokens, greedy, thinking off"
             + (", stop tokens banned" if a.history == "scripted" else "")
             + (f"; a new user message every {a.user_every} turns" if a.user_every else "")
             + f"; tool results {a.result_chars[0]}-{a.result_chars[1]} characters; seed "
               f"{a.seed}.")
    L.append("")
    L.append("Server commands (ports vary per run; one fresh process per workload):")
    L.append("")
    for k, v in res["cmds"].items():
        L.append(f"- {k}: `{v}`")
    L.append("")
    L.append(f"Columns: prompt = usage.prompt_tokens; new = prompt - the previous turn's prompt "
             f"(same conversation); reusable = common prefix of this and the previous turn's "
             f"prompt token ids (qwenrt template + tokenize); cached = usage.prompt_tokens_"
             f"details.cached_tokens; prefilled = llama-server's timings.prompt_n, for qwenrt "
             f"prompt - cached; TTFT = request sent -> first delta with generated output; "
             f"target: prefilled <= new + {PAGE} (turns 2..{a.turns}).")
    L.append("")
    if res["checks"]:
        L.append(f"**Checks: {len(res['checks'])} problem(s)** (first 30):")
        L.append("")
        for c in res["checks"][:30]:
            L.append(f"- {c}")
    else:
        L.append("Checks: every response 200 with a complete, non-empty reply; prompt_tokens "
                 "strictly increase turn over turn in every conversation"
                 + ("; the same prompt_tokens on every server for every turn, equal to "
                    "qwenrt's own rendering" if a.history == "scripted" else "")
                 + ("; llama-server's prompt_n + cache_n = prompt_tokens" if not a.skip_llamacpp
                    else "") + ".")
    L.append("")
    for n in a.note or []:
        L.append(f"Note: {n}")
        L.append("")
    renders = res.get("renders") or {}
    for wl in a.workloads:
        L.append(f"## {wl}: {WORKLOAD_TEXT[wl].format(k=a.conversations, p=a.parallel)}")
        L.append("")
        L.append(f"| server | target met (turns 2..{a.turns}) | worst prefilled - new | median "
                 f"TTFT turn 1 | median TTFT turns 2..{a.turns} | prefilled / prompt tokens, "
                 f"all turns | wall | RSS idle -> peak MiB |")
        L.append("|---|---|---|---|---|---|---|---|")
        for label in res["labels"]:
            run = res["runs"][label].get(wl)
            if not run or not run["records"]:
                L.append(f"| {label} | failed | | | | | | |")
                continue
            s = summary(run)
            L.append(f"| {label} | {s['met']} / {s['of']} | {fmt(s['worst_excess'])} | "
                     f"{fmt(s['ttft_first_med'])} ms | {fmt(s['ttft_med'])} ms | "
                     f"{s['prefilled']} / {s['prompt']} | {run['wall_s']:.1f} s | "
                     f"{fmt(run['rss_idle'])} -> {fmt(run['rss_peak'])} |")
        L.append("")
        for label in res["labels"]:
            run = res["runs"][label].get(wl)
            if not run or not run["records"]:
                continue
            L.append(f"### {wl}, {label}")
            L.append("")
            multi = wl != "single"
            if multi:
                L.append(f"One value per conversation, in order {workload_numbers(a, wl)}.")
                L.append("")
            L.append("| turn | prompt | new | reusable | cached | prefilled | TTFT ms | total ms "
                     "| target met |")
            L.append("|---|---|---|---|---|---|---|---|---|")
            by_turn: dict[int, list[dict]] = {}
            for r in run["records"]:
                by_turn.setdefault(r["turn"], []).append(r)
            for turn in sorted(by_turn):
                rs = sorted(by_turn[turn], key=lambda r: r["conversation"])

                def col(f):
                    return " / ".join(f(r) for r in rs)

                reus = col(lambda r: fmt(renders[r["conversation"]][turn - 1]["reusable"])
                           if r["conversation"] in renders and turn > 1 else "-")
                met = [r["target_met"] for r in rs]
                met_s = "-" if turn == 1 else (
                    f"{sum(1 for m in met if m)} of {len(met)}" if multi else
                    ("yes" if met[0] else "**no**"))
                L.append(f"| {turn} | {col(lambda r: fmt(r['prompt_tokens']))} | "
                         f"{col(lambda r: fmt(r['new_tokens']))} | {reus} | "
                         f"{col(lambda r: fmt(r['cached_tokens']))} | "
                         f"{col(lambda r: fmt(r['prefilled']))} | "
                         f"{col(lambda r: fmt(r['ttft_ms']))} | "
                         f"{col(lambda r: fmt(r['total_ms']))} | {met_s} |")
            L.append("")
    L.append("Startup (/health 200) per process, s: " + "; ".join(
        f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in res["startup_s"].items())
        + ". Exit codes on SIGTERM: " + "; ".join(f"{k} {v}" for k, v in res["rc"].items())
        + f". The whole run took {res['elapsed_s']:.0f} s.")
    L.append("")
    return "\n".join(L) + "\n"


def json_text(x, depth: int = 0) -> str:
    """Indented JSON with one line per request record (and per other small object), so the file
    reads and diffs by record."""
    flat = json.dumps(x, default=str)
    if depth >= 5 or len(flat) <= 300 or not isinstance(x, (dict, list)):
        return flat
    pad = " " * (depth + 1)
    if isinstance(x, dict):
        items = [f"{pad}{json.dumps(str(k))}: {json_text(v, depth + 1)}" for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    return "[\n" + ",\n".join(pad + json_text(v, depth + 1) for v in x) + "\n" + " " * depth + "]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", type=Path, default=REPO / "models/qwen35-chat-tiny.Q8_0.gguf")
    ap.add_argument("--qwenrt", type=Path, default=REPO / "build/qwenrt")
    ap.add_argument("--llama-server", type=Path, default=sl.DEFAULT_LLAMA_SERVER)
    ap.add_argument("--parallel", type=int, default=2, help="slots on every server")
    ap.add_argument("-c", "--ctx", type=int, default=4096,
                    help="context per slot (the tiny models' context_length is 4096)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--queue", type=int, default=256, help="qwenrt --max-queue")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--conversations", type=int, default=5,
                    help="conversations of the interleaved workloads (more than --parallel)")
    ap.add_argument("--workloads", default="single,interleaved,concurrent",
                    help="comma-separated: single, interleaved, concurrent")
    ap.add_argument("--history", choices=["scripted", "model"], default="scripted")
    ap.add_argument("--user-every", type=int, default=0,
                    help="a new user message in the history every N turns (0: never)")
    ap.add_argument("--result-chars", type=int, nargs=2, default=[140, 250],
                    metavar=("MIN", "MAX"), help="length of a tool result in characters")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--cache-kv-mb", type=int, help="qwenrt --cache-kv-mb (cache on only)")
    ap.add_argument("--cache-state-mb", type=int, help="qwenrt --cache-state-mb (cache on only)")
    ap.add_argument("--cache-host-mb", type=int, help="qwenrt --cache-host-mb (cache on only)")
    ap.add_argument("--llama-arg", action="append",
                    help="an extra llama-server argument (repeatable, e.g. "
                         "--llama-arg=--cache-reuse --llama-arg=256)")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--note", action="append", help="a line for the report (repeatable)")
    ap.add_argument("--out", type=Path, help="the Markdown report")
    ap.add_argument("--json", type=Path, help="every request's record as JSON")
    a = ap.parse_args()
    a.serve_arg = None  # server_load.qwenrt_cmd reads it (its --serve-arg); the budgets go as flags
    a.workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for w in a.workloads:
        if w not in WORKLOAD_TEXT:
            ap.error(f"--workloads: unknown workload {w!r} (single, interleaved, concurrent)")
    if a.conversations <= a.parallel and any(w != "single" for w in a.workloads):
        print(f"warning: --conversations {a.conversations} is not more than --parallel "
              f"{a.parallel}", file=sys.stderr)
    for name in ("no_proxy", "NO_PROXY"):
        os.environ[name] = ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get(name)]))
    # The checkout is shared and build/qwenrt gets rebuilt while a run goes on: run a copy.
    a.qwenrt_orig = a.qwenrt
    a.qwenrt_built = datetime.datetime.fromtimestamp(a.qwenrt.stat().st_mtime,
                                                     datetime.timezone.utc)
    a.qwenrt_sha = hashlib.sha256(a.qwenrt.read_bytes()).hexdigest()[:12]
    a.git_rev = sl.git_rev()
    snapshot = Path(tempfile.mkdtemp(prefix="prefix-cache-bin-"))
    try:
        a.qwenrt = snapshot / "qwenrt"
        shutil.copy2(a.qwenrt_orig, a.qwenrt)
        a.prefix_cache_flag = qwenrt_has_prefix_cache(a)
        res = asyncio.run(main_async(a))
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    text = report(a, res, [Path(sys.executable).name, *sys.argv])
    print(text)
    if a.out:
        a.out.write_text(text)
    if a.json:
        meta = {k: (sl.shown(v) if isinstance(v, Path) else v) for k, v in vars(a).items()
                if k != "qwenrt"}
        a.json.write_text(json_text({"args": meta, **res}) + "\n")
    if res["checks"]:
        print(f"{len(res['checks'])} check(s) failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
