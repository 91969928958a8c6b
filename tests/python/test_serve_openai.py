#!/usr/bin/env python3
"""`qwenrt serve` on the embedded tiny chat model (cpu backend), driven with the official `openai`
SDK (tools/requirements.txt pins it) and raw HTTP where the SDK cannot go:
  chat streamed == not streamed (greedy), reasoning on and off, a tool round trip (call -> tool
  result -> answer) and tool_choice required, tool-call arguments streamed as fragments (raw and
  through the SDK's accumulator) == the whole arguments, usage equal to `qwenrt template` + `qwenrt tokenize`
  counts, seeds reproducible, n > 1, logprobs consistent, /v1/completions (text and token ids),
  paths without /v1, CORS preflight, a 100 MB body -> 413, a prompt over the context -> 400,
  32 concurrent greedy requests == the same one at a time, a client leaving mid-stream leaves no
  running sequence (/metrics), the server still serving after every bad request; a second server
  with --api-key (401 / Bearer / x-api-key / public /health) stopped by SIGTERM mid-stream (the
  stream completes, exit 0).
Prints one line per check; exits 1 on any failure.

Usage: test_serve_openai.py --qwenrt PATH/qwenrt [--tool ...]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "models", "qwen35-chat-tiny.Q8_0.gguf")
CTX = 1024
failures = []

GET_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
# Three parameters, one of them typed (a number streams whole once it has ended, strings stream as
# they are generated); the tiny model was trained on it.
CONVERT = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money between currencies.",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "from_currency": {"type": "string"},
        "to_currency": {"type": "string"}}, "required": ["amount", "from_currency", "to_currency"]}}}


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)}", flush=True)
    if not ok:
        failures.append(name)
    return ok


def test_args():
    """The command line every serve test takes (--qwenrt, --tool from ctest); loopback requests
    never go through a proxy the environment sets."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwenrt", required=True)
    ap.add_argument("--tool")
    args = ap.parse_args()
    for name in ("no_proxy", "NO_PROXY"):
        os.environ[name] = ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get(name)]))
    return args


def finish(t0):
    """The count of failed checks, and the exit status that says whether there were any."""
    print(f"{len(failures)} failures, {time.time() - t0:.1f}s")
    sys.exit(1 if failures else 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, qwenrt, *extra, parallel=4, max_queue=64, backend="cpu"):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="qwenrt-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [qwenrt, "serve", "-m", MODEL, "--backend", backend, "-t", "2", "--port", str(self.port),
             "--parallel", str(parallel), "-c", str(CTX), "--max-queue", str(max_queue), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"server did not come up: {self.output()}")

    def request(self, method, path, body=None, headers=None, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            h = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def metrics(self, headers=None):
        _, _, body = self.request("GET", "/metrics", headers=headers)
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.returncode


def token_count(qwenrt, text):
    out = subprocess.run([qwenrt, "tokenize", "-m", MODEL, "--special", text], check=True,
                         capture_output=True, text=True).stdout.split()
    return len(out)


def rendered_prompt_tokens(qwenrt, messages, tools=None, think=True):
    with tempfile.TemporaryDirectory() as d:
        mp = os.path.join(d, "m.json")
        with open(mp, "w") as f:
            json.dump(messages, f)
        cmd = [qwenrt, "template", "-m", MODEL, "--messages", mp]
        if tools:
            tp = os.path.join(d, "t.json")
            with open(tp, "w") as f:
                json.dump(tools, f)
            cmd += ["--tools", tp]
        if not think:
            cmd.append("--no-think")
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return token_count(qwenrt, text)


def chat_checks(client, server, qwenrt):
    from openai import OpenAI  # noqa: F401
    q = [{"role": "user", "content": "What is 12 + 7?"}]
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}

    r = client.chat.completions.create(model="tiny", messages=q, temperature=0, max_tokens=64,
                                       extra_body=no_think)
    msg = r.choices[0].message
    check("chat: content, finish stop", bool(msg.content) and r.choices[0].finish_reason == "stop",
          r)
    check("chat: no reasoning with thinking off", not getattr(msg, "reasoning_content", None), msg)
    check("chat: arithmetic answered", "19" in msg.content, msg.content)
    n_prompt = rendered_prompt_tokens(qwenrt, q, think=False)
    check("chat: usage.prompt_tokens == tokenizer count", r.usage.prompt_tokens == n_prompt,
          (r.usage.prompt_tokens, n_prompt))
    check("chat: total = prompt + completion",
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    check("chat: cached_tokens reported", r.usage.prompt_tokens_details.cached_tokens == 0,
          r.usage)

    # Streamed == not streamed (greedy), thinking on: reasoning deltas and content deltas.
    whole = client.chat.completions.create(model="tiny", messages=q, temperature=0,
                                           max_tokens=200)
    wmsg = whole.choices[0].message
    check("chat: reasoning_content with thinking on", bool(getattr(wmsg, "reasoning_content", "")),
          wmsg)
    reasoning, content, finish, usage = "", "", None, None
    for chunk in client.chat.completions.create(model="tiny", messages=q, temperature=0,
                                                max_tokens=200, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            d = c.delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            finish = c.finish_reason or finish
    check("stream: content == non-streamed", content == wmsg.content, (content, wmsg.content))
    check("stream: reasoning == non-streamed", reasoning == wmsg.reasoning_content,
          (reasoning, wmsg.reasoning_content))
    check("stream: finish_reason", finish == whole.choices[0].finish_reason, finish)
    check("stream: include_usage == non-streamed usage",
          usage is not None and usage.completion_tokens == whole.usage.completion_tokens
          and usage.prompt_tokens == whole.usage.prompt_tokens, (usage, whole.usage))

    # History with reasoning_content accepted back.
    hist = q + [{"role": "assistant", "content": wmsg.content,
                 "reasoning_content": wmsg.reasoning_content},
                {"role": "user", "content": "What is 3 + 4?"}]
    r2 = client.chat.completions.create(model="tiny", messages=hist, temperature=0,
                                        max_tokens=64, extra_body=no_think)
    check("chat: reasoning_content accepted in history", bool(r2.choices[0].message.content), r2)

    # Seeds: the same seed repeats; n > 1 gives n choices.
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me a short story."}],
              temperature=1.0, max_tokens=24, extra_body=no_think)
    a = client.chat.completions.create(seed=1234, **kw)
    b = client.chat.completions.create(seed=1234, **kw)
    check("seed: reproducible", a.choices[0].message.content == b.choices[0].message.content,
          (a.choices[0].message.content, b.choices[0].message.content))
    n3 = client.chat.completions.create(seed=5, n=3, **kw)
    check("n=3: three choices, indexed", [c.index for c in n3.choices] == [0, 1, 2], n3)
    single = [client.chat.completions.create(seed=5 + i, **kw).choices[0].message.content
              for i in range(3)]
    check("n=3: choice i == seed + i alone", [c.message.content for c in n3.choices] == single,
          (n3.choices, single))
    check("n=3: usage sums the choices",
          n3.usage.completion_tokens >= 3 and n3.usage.prompt_tokens == a.usage.prompt_tokens,
          n3.usage)

    # Logprobs: one entry per completion token; greedy picks the most likely.
    lp = client.chat.completions.create(model="tiny", messages=q, temperature=0, max_tokens=32,
                                        logprobs=True, top_logprobs=3, extra_body=no_think)
    items = lp.choices[0].logprobs.content
    check("logprobs: one per completion token", len(items) == lp.usage.completion_tokens,
          (len(items), lp.usage.completion_tokens))
    ok = all(len(t.top_logprobs) == 3 and t.logprob <= 0 and
             abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4 and
             all(t.top_logprobs[k].logprob >= t.top_logprobs[k + 1].logprob for k in range(2))
             for t in items)
    check("logprobs: greedy token is the top alternative, sorted", ok, items[:2])
    check("logprobs: tokens spell the content",
          "".join(t.token for t in items).strip() == lp.choices[0].message.content.strip(),
          ["".join(t.token for t in items), lp.choices[0].message.content])


def tool_checks(client, server, qwenrt):
    user = [{"role": "user", "content": "Tell me the time in Chicago."}]
    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    r = client.chat.completions.create(model="tiny", messages=user, tools=[GET_TIME],
                                       temperature=0, max_tokens=128, extra_body=no_think)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    check("tools: one call, finish tool_calls", len(calls) == 1 and c.finish_reason == "tool_calls",
          c)
    if not calls:
        return
    call = calls[0]
    args = json.loads(call.function.arguments)
    check("tools: name and arguments", call.function.name == "get_time" and
          args.get("city") == "Chicago", call)
    check("tools: usage.prompt_tokens with tools",
          r.usage.prompt_tokens == rendered_prompt_tokens(qwenrt, user, [GET_TIME], think=False),
          r.usage)

    # Streamed: id and name once, argument fragments concatenate to the whole string.
    ids, names, fragments = [], [], ""
    for chunk in client.chat.completions.create(model="tiny", messages=user, tools=[GET_TIME],
                                                temperature=0, max_tokens=128, stream=True,
                                                extra_body=no_think):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.id:
                    ids.append(tc.id)
                    names.append(tc.function.name)
                fragments += tc.function.arguments or ""
    check("tools stream: id and name once", len(ids) == 1 and names == ["get_time"], (ids, names))
    check("tools stream: fragments == arguments", fragments == call.function.arguments,
          (fragments, call.function.arguments))

    # A call of three parameters streams its arguments in fragments while it is generated: the
    # raw fragments concatenate to the whole reply's string, and the SDK's own accumulator
    # (chat.completions.stream -> get_final_completion) yields the same arguments.
    ask = [{"role": "user", "content": "Convert 250 USD to EUR."}]
    kw = dict(model="tiny", messages=ask, tools=[CONVERT], temperature=0, max_tokens=128,
              extra_body=no_think)
    wc = (client.chat.completions.create(**kw).choices[0].message.tool_calls or [None])[0]
    check("tools (3 parameters): a call", wc is not None and wc.function.name == "convert_currency"
          and json.loads(wc.function.arguments) == {"amount": 250, "from_currency": "USD",
                                                     "to_currency": "EUR"}, wc)
    if wc is not None:
        pieces, headers = [], []
        for chunk in client.chat.completions.create(stream=True, **kw):
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    if tc.id:
                        headers.append((tc.index, tc.function.name, tc.function.arguments))
                    elif tc.function and tc.function.arguments:
                        pieces.append((tc.index, tc.function.arguments))
        check("tools stream (3 parameters): header once, then fragments",
              headers == [(0, "convert_currency", "")] and len(pieces) >= 4 and
              all(i == 0 for i, _ in pieces), (headers, pieces))
        joined = "".join(f for _, f in pieces)
        check("tools stream (3 parameters): fragments == arguments, same JSON",
              joined == wc.function.arguments and
              json.loads(joined) == json.loads(wc.function.arguments),
              (joined, wc.function.arguments))
        with client.chat.completions.stream(**kw) as stream:
            deltas = [e.arguments_delta for e in stream
                      if e.type == "tool_calls.function.arguments.delta"]
            final = stream.get_final_completion()
        fc = (final.choices[0].message.tool_calls or [None])[0]
        check("tools stream (3 parameters): SDK accumulator == not streamed",
              fc is not None and fc.function.name == wc.function.name and
              json.loads(fc.function.arguments) == json.loads(wc.function.arguments) and
              len(deltas) >= 4 and final.choices[0].finish_reason == "tool_calls",
              (fc, deltas))

    # Round trip: the tool's result goes back, the model answers.
    history = user + [{"role": "assistant", "content": c.message.content,
                       "tool_calls": [{"id": call.id, "type": "function",
                                       "function": {"name": "get_time",
                                                    "arguments": call.function.arguments}}]},
                      {"role": "tool", "tool_call_id": call.id, "content": "09:41"}]
    r2 = client.chat.completions.create(model="tiny", messages=history, tools=[GET_TIME],
                                        temperature=0, max_tokens=96, extra_body=no_think)
    a2 = r2.choices[0]
    check("tools: answer after the tool result", a2.finish_reason == "stop" and
          bool(a2.message.content) and not a2.message.tool_calls, a2)

    # tool_choice required: a call (the tiny model writes nonsense names when forced to call for
    # a question that needs none, so the question is one it would call for).
    rq = client.chat.completions.create(model="tiny", messages=user,
                                        tools=[GET_TIME], tool_choice="required", temperature=0,
                                        max_tokens=64, extra_body=no_think)
    check("tool_choice required: a call", bool(rq.choices[0].message.tool_calls), rq.choices[0])
    named = client.chat.completions.create(
        model="tiny", messages=user, tools=[GET_TIME], temperature=0, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, extra_body=no_think)
    nc = named.choices[0].message.tool_calls or []
    check("tool_choice named: that call", len(nc) >= 1 and nc[0].function.name == "get_time",
          named.choices[0])
    none = client.chat.completions.create(model="tiny", messages=user, tools=[GET_TIME],
                                          tool_choice="none", temperature=0, max_tokens=64,
                                          extra_body=no_think)
    check("tool_choice none: no call, no tools in the prompt",
          not none.choices[0].message.tool_calls and
          none.usage.prompt_tokens == rendered_prompt_tokens(qwenrt, user, think=False),
          none)
    # A call cut off by max_tokens: reported, finish_reason length, no raw XML.
    cut = client.chat.completions.create(model="tiny", messages=user, tools=[GET_TIME],
                                         temperature=0, max_tokens=8, extra_body=no_think)
    cc = cut.choices[0]
    check("tools: cut-off call is length and no XML", cc.finish_reason == "length" and
          "<tool_call>" not in (cc.message.content or "") and
          "<function" not in (cc.message.content or ""), cc)


def completion_checks(server, qwenrt, client):
    r = client.completions.create(model="tiny", prompt="The cat", max_tokens=12, temperature=0,
                                  logprobs=2)
    c = r.choices[0]
    check("completions: text", isinstance(c.text, str) and c.finish_reason in ("stop", "length"),
          c)
    check("completions: prompt_tokens == tokenize", r.usage.prompt_tokens ==
          token_count(qwenrt, "The cat"), r.usage)
    check("completions: logprobs per token", len(c.logprobs.tokens) == r.usage.completion_tokens and
          "".join(c.logprobs.tokens) == c.text, c.logprobs)
    ids = subprocess.run([qwenrt, "tokenize", "-m", MODEL, "The cat"], check=True,
                         capture_output=True, text=True).stdout.split()
    r2 = client.completions.create(model="tiny", prompt=[int(x) for x in ids], max_tokens=12,
                                   temperature=0)
    check("completions: token-id prompt == text prompt", r2.choices[0].text == c.text,
          (r2.choices[0].text, c.text))
    text = ""
    for chunk in client.completions.create(model="tiny", prompt="The cat", max_tokens=12,
                                           temperature=0, stream=True):
        text += chunk.choices[0].text if chunk.choices else ""
    check("completions: streamed == whole", text == c.text, (text, c.text))
    # Without the /v1 prefix; models; CORS.
    status, _, body = server.request("POST", "/completions", {"prompt": "The cat", "max_tokens": 12,
                                                              "temperature": 0})
    check("completions: path without /v1", status == 200 and
          json.loads(body)["choices"][0]["text"] == c.text, body[:200])
    status, _, body = server.request("GET", "/models")
    models = json.loads(body)
    check("models: lists the model", status == 200 and models["data"][0]["object"] == "model",
          body[:200])
    info = json.loads(subprocess.run([qwenrt, "info", "--json", MODEL], check=True,
                                     capture_output=True, text=True).stdout)["qwenrt"]
    shown = models["data"][0].get("qwenrt", {})
    check("models: the identity and defaults in force, as `qwenrt info --json` shows them",
          shown == info and shown["chat_dialect"] == "qwen3.5" and
          shown["sampling"]["thinking"]["top_k"] == 20 and shown["drafter"]["depth"] == 2,
          (shown, info))
    status, headers, _ = server.request("OPTIONS", "/v1/chat/completions", None, {
        "Origin": "http://example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    check("CORS preflight", status == 204 and headers.get("Access-Control-Allow-Origin") == "*"
          and "POST" in headers.get("Access-Control-Allow-Methods", ""), (status, headers))


def bad_request_checks(server):
    def still_serving():
        s, _, b = server.request("POST", "/v1/completions", {"prompt": "1", "max_tokens": 1})
        return s == 200

    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    cases = [
        ("malformed JSON", b"{\"messages\": [", 400, None),
        ("invalid UTF-8", b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",
         400, None),
        ("not an object", b"[1, 2]", 400, None),
        ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
         "messages[0].role"),
        ("number overflowing a double", b"{\"messages\": [{\"role\": \"user\", \"content\":"
                                        b" \"x\"}], \"temperature\": 1e999}", 400, None),
        ("negative max_tokens", {"messages": user, "max_tokens": -1}, 400, "max_tokens"),
        ("huge n", {"messages": user, "n": 10 ** 30}, 400, "n"),
        ("stop of wrong type", {"messages": user, "stop": [1]}, 400, "stop[0]"),
        ("bad tool schema", {"messages": user, "tools": [{"type": "function",
                                                          "function": {"name": "f",
                                                                       "parameters": 7}}]},
         400, "tools[0].function.parameters"),
        ("tool_choice unknown tool", {"messages": user, "tools": [GET_TIME],
                                      "tool_choice": {"type": "function",
                                                      "function": {"name": "nope"}}},
         400, "tool_choice.function.name"),
        ("image part", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
         "messages[0].content[0].type"),
        ("chat_template_kwargs wrong type", {"messages": user,
                                             "chat_template_kwargs": {"enable_thinking": "yes"}},
         400, "chat_template_kwargs"),
        ("prompt over the context", {"messages": [{"role": "user", "content": "one two " * 1500}]},
         400, "messages"),
        ("unknown endpoint", {"x": 1}, 404, None),
    ]
    for name, body, status, param in cases:
        path = "/v1/nowhere" if status == 404 else chat
        s, _, b = server.request("POST", path, body)
        err = {}
        try:
            err = json.loads(b)["error"]
        except (ValueError, KeyError):
            pass
        ok = s == status and isinstance(err.get("message"), str) and "type" in err
        if param:
            ok = ok and err.get("param") == param and param in err["message"]
        check(f"bad request: {name} -> {status}", ok, (s, b[:300]))
        check(f"bad request: {name}: still serving", still_serving())
    # A 100 MB body: 413, read by the client (not a reset connection).
    big = b"{\"messages\": [{\"role\": \"user\", \"content\": \"" + b"a" * (100 << 20) + b"\"}]}"
    try:
        s, _, b = server.request("POST", chat, big, timeout=60)
        check("100 MB body -> 413", s == 413 and "limit" in json.loads(b)["error"]["message"],
              (s, b[:200]))
    except OSError as e:
        check("100 MB body -> 413", False, e)
    check("100 MB body: still serving", still_serving())
    s, _, b = server.request("GET", "/v1/chat/completions")
    check("GET on a POST endpoint -> 405", s == 405, (s, b))


def concurrency_checks(client, server):
    prompts = [f"What is {a} + {b}?" for a, b in zip(range(3, 35), range(40, 72))]

    def ask(p):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": p}], temperature=0, max_tokens=24,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        return r.choices[0].message.content, r.choices[0].finish_reason

    t0 = time.time()
    one_by_one = [ask(p) for p in prompts]
    t1 = time.time()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(ask, prompts))
    t2 = time.time()
    same = sum(a == b for a, b in zip(one_by_one, together))
    check("32 concurrent greedy == one at a time", same == len(prompts),
          f"{same}/{len(prompts)} equal")
    print(f"     32 requests: one at a time {t1 - t0:.2f}s, concurrent {t2 - t1:.2f}s")


def disconnect_check(server, qwenrt):
    stops = [int(x) for x in subprocess.run(
        [qwenrt, "tokenize", "-m", MODEL, "--special", "<|im_end|><|endoftext|>"], check=True,
        capture_output=True, text=True).stdout.split()]
    before = server.metrics()
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 900, "stream": True,
                       "logit_bias": {str(t): -100 for t in stops}}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    running = server.metrics().get("qwenrt_running_sequences", 0)
    s.close()
    ok = False
    for _ in range(100):
        m = server.metrics()
        if m.get("qwenrt_running_sequences", 1) == 0 and \
                m.get("qwenrt_sequences_cancelled_total", 0) > before.get(
                    "qwenrt_sequences_cancelled_total", 0):
            ok = True
            break
        time.sleep(0.05)
    check("disconnect mid-stream: was running, then none running and one cancelled",
          running >= 1 and ok, (running, server.metrics().get("qwenrt_running_sequences")))
    m = server.metrics()
    check("metrics: histograms and counters", "qwenrt_time_to_first_token_seconds_count" in m and
          m.get("qwenrt_generated_tokens_total", 0) > 0 and "qwenrt_kv_pages_in_use" in m, m)


def auth_and_shutdown_checks(qwenrt):
    server = Server(qwenrt, "--api-key", "s3cret")
    try:
        body = {"prompt": "1", "max_tokens": 1}
        s, _, b = server.request("POST", "/v1/completions", body)
        check("api key: missing -> 401 in OpenAI's shape", s == 401 and
              json.loads(b)["error"]["code"] == "invalid_api_key", (s, b))
        s, _, _ = server.request("POST", "/v1/completions", body, {"Authorization": "Bearer nope"})
        check("api key: wrong -> 401", s == 401)
        s, _, _ = server.request("POST", "/v1/completions", body,
                                 {"Authorization": "Bearer s3cret"})
        check("api key: Bearer -> 200", s == 200)
        s, _, _ = server.request("POST", "/v1/completions", body, {"x-api-key": "s3cret"})
        check("api key: x-api-key -> 200", s == 200)
        s, _, _ = server.request("GET", "/health")
        check("api key: /health is public", s == 200)
        # SIGTERM while a stream runs: it completes, the process exits 0.
        req = json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "stream": True,
                          "temperature": 0}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret"
                     b"\r\nContent-Length: " + str(len(req)).encode() + b"\r\n\r\n" + req)
        got = sock.recv(4096)
        server.proc.send_signal(signal.SIGTERM)
        sock.settimeout(30)
        while not got.endswith(b"0\r\n\r\n"):
            more = sock.recv(65536)
            if not more:
                break
            got += more
        sock.close()
        check("SIGTERM: the running stream completes", b"data: [DONE]" in got and
              b"finish_reason\":\"" in got, got[-300:])
        rc = server.proc.wait(30)
        check("SIGTERM: exit code 0", rc == 0, rc)
        log = server.output()
        check("request log line", re.search(r"serve: req-\d+ /v1/completions 200 prompt \d+ cached \d+ gen \d+ "
                                            r"ttft [\d.]+s", log) is not None, log[-800:])
    finally:
        server.stop()


def main():
    args = test_args()
    import openai
    print(f"openai {openai.__version__}")
    t0 = time.time()
    server = Server(args.qwenrt)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        for group in (chat_checks, tool_checks):
            group(client, server, args.qwenrt)
        completion_checks(server, args.qwenrt, client)
        bad_request_checks(server)
        concurrency_checks(client, server)
        disconnect_check(server, args.qwenrt)
    finally:
        rc = server.stop()
    check("server: exit 0 on SIGTERM", rc == 0, rc)
    auth_and_shutdown_checks(args.qwenrt)
    finish(t0)


if __name__ == "__main__":
    main()
