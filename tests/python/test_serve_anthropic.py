#!/usr/bin/env python3
"""`qwenrt serve`'s Anthropic dialect (/v1/messages, /v1/messages/count_tokens) on the embedded
tiny chat model (cpu backend), driven with the official `anthropic` SDK (tools/requirements.txt
pins it) and raw HTTP where the SDK cannot go:
  text with thinking off (the default) and on (budget_tokens), streamed == not streamed (greedy,
  through the SDK's stream accumulator), a tool round trip (tool_use -> tool_result -> answer) and
  tool_choice any, streamed tool input == whole input (a three-parameter call in several
  input_json_delta fragments, accumulated by the SDK, == the OpenAI route's arguments), count_tokens == usage.input_tokens of the
  same request == `qwenrt template` + `qwenrt tokenize`, stop_sequences -> stop_sequence,
  max_tokens -> max_tokens, errors in Anthropic's shape (400 naming the field, 404, 401 with
  --api-key, x-api-key accepted) and the server still serving after each; the errors made before
  a reply exists (413 from the HTTP layer, 404, 405, 401, 429 with Retry-After, 504 timeout) in
  Anthropic's shape on Anthropic's routes and in OpenAI's on OpenAI's.
Prints one line per check; exits 1 on any failure.

Usage: test_serve_anthropic.py --qwenrt PATH/qwenrt [--tool ...]
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve_openai import (MODEL, Server, check, finish,  # noqa: E402
                               rendered_prompt_tokens, test_args)

GET_TIME = {"name": "get_time", "description": "Get the local time in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}
GET_TIME_OPENAI = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city.",
    "parameters": GET_TIME["input_schema"]}}
CONVERT = {"name": "convert_currency",
           "description": "Convert an amount of money between currencies.",
           "input_schema": {"type": "object", "properties": {
               "amount": {"type": "number"}, "from_currency": {"type": "string"},
               "to_currency": {"type": "string"}},
               "required": ["amount", "from_currency", "to_currency"]}}
Q = [{"role": "user", "content": "What is 12 + 7?"}]
# Greedy: this SDK version has no temperature argument; the body field is still Anthropic's.
T0 = {"temperature": 0}


def prompt_of(usage):
    """All the prompt's tokens: Anthropic counts those read from the cache apart."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def thinking_of(message):
    return "".join(b.thinking for b in message.content if b.type == "thinking")


def still_serves(client, what):
    r = client.messages.create(model="tiny", max_tokens=8, messages=Q, extra_body=T0)
    check(f"{what}: server still serves", r.type == "message" and r.usage.output_tokens > 0, r)


def text_checks(client, server, qwenrt):
    r = client.messages.create(model="tiny", max_tokens=64, messages=Q, extra_body=T0)
    check("text: answer, end_turn", "19" in text_of(r) and r.stop_reason == "end_turn", r)
    check("text: no thinking by default", not thinking_of(r), r.content)
    check("text: ids and usage", r.id.startswith("msg_") and r.role == "assistant" and
          r.usage.cache_read_input_tokens == 0 and r.usage.cache_creation_input_tokens == 0, r)
    n = rendered_prompt_tokens(qwenrt, Q, think=False)
    counted = client.messages.count_tokens(model="tiny", messages=Q)
    check("count_tokens == usage.input_tokens == tokenize(rendered)",
          counted.input_tokens == prompt_of(r.usage) == n,
          (counted.input_tokens, r.usage.input_tokens, n))

    # Thinking on: a thinking block first; streamed through the SDK == not streamed.
    think = {"type": "enabled", "budget_tokens": 150}
    w = client.messages.create(model="tiny", max_tokens=250, messages=Q, extra_body=T0,
                               thinking=think)
    check("thinking: a thinking block, then text", w.content[0].type == "thinking" and
          bool(thinking_of(w)) and "19" in text_of(w), w.content)
    check("thinking: usage.input_tokens == tokenize(rendered, thinking)",
          prompt_of(w.usage) == rendered_prompt_tokens(qwenrt, Q, think=True), w.usage)
    with client.messages.stream(model="tiny", max_tokens=250, messages=Q, extra_body=T0,
                                thinking=think) as stream:
        types = [e.type for e in stream]
        s = stream.get_final_message()
    check("stream: event sequence", types[0] == "message_start" and types[-1] == "message_stop"
          and "content_block_delta" in types and "message_delta" in types, types[:4])
    check("stream: thinking == not streamed", thinking_of(s) == thinking_of(w),
          (thinking_of(s), thinking_of(w)))
    check("stream: text == not streamed", text_of(s) == text_of(w), (text_of(s), text_of(w)))
    check("stream: stop_reason and usage", s.stop_reason == w.stop_reason and
          s.usage.output_tokens == w.usage.output_tokens and
          prompt_of(s.usage) == prompt_of(w.usage), (s.usage, w.usage))
    # Thinking history read back.
    hist = Q + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": thinking_of(w), "signature": ""},
        {"type": "text", "text": text_of(w)}]}, {"role": "user", "content": "What is 3 + 4?"}]
    h = client.messages.create(model="tiny", max_tokens=64, messages=hist, extra_body=T0)
    check("history with thinking blocks accepted", bool(text_of(h)), h)

    # stop_sequences: cut before the first one, named.
    first = text_of(r)
    stop = "="
    if stop in first:
        sr = client.messages.create(model="tiny", max_tokens=64, messages=Q, extra_body=T0,
                                    stop_sequences=["@@", stop])
        check("stop_sequences: stop_sequence reported",
              sr.stop_reason == "stop_sequence" and sr.stop_sequence == stop and
              text_of(sr) == first[:first.index(stop)].strip(), sr)
    else:
        check("stop_sequences: answer has '='", False, first)
    mr = client.messages.create(model="tiny", max_tokens=3, messages=Q, extra_body=T0)
    check("max_tokens: stop_reason max_tokens", mr.stop_reason == "max_tokens" and
          mr.usage.output_tokens == 3, mr)


def tool_checks(client, server, qwenrt):
    user = [{"role": "user", "content": "Tell me the time in Chicago."}]
    r = client.messages.create(model="tiny", max_tokens=128, messages=user, tools=[GET_TIME],
                               extra_body=T0)
    uses = [b for b in r.content if b.type == "tool_use"]
    check("tools: tool_use, stop_reason tool_use", len(uses) == 1 and r.stop_reason == "tool_use",
          r)
    if not uses:
        return
    use = uses[0]
    check("tools: name and input", use.name == "get_time" and use.input.get("city") == "Chicago" and
          use.id.startswith("toolu_"), use)
    check("tools: count_tokens with tools == usage.input_tokens == tokenize(rendered)",
          client.messages.count_tokens(model="tiny", messages=user, tools=[GET_TIME]).input_tokens
          == prompt_of(r.usage) == rendered_prompt_tokens(qwenrt, user, [GET_TIME_OPENAI],
                                                            think=False), r.usage)
    with client.messages.stream(model="tiny", max_tokens=128, messages=user, tools=[GET_TIME],
                                extra_body=T0) as stream:
        s = stream.get_final_message()
    su = [b for b in s.content if b.type == "tool_use"]
    check("tools stream: input == not streamed", len(su) == 1 and su[0].input == use.input and
          s.stop_reason == "tool_use", s.content)
    # Three parameters: the input streams as input_json_delta fragments (several, not one at the
    # end); the SDK's accumulator gives the input of the non-streamed reply, whose JSON is the
    # OpenAI route's arguments string for the same greedy request.
    ask = [{"role": "user", "content": "Convert 250 USD to EUR."}]
    kw = dict(model="tiny", max_tokens=128, messages=ask, tools=[CONVERT], extra_body=T0)
    wc = [b for b in client.messages.create(**kw).content if b.type == "tool_use"]
    check("tools (3 parameters): tool_use", len(wc) == 1 and wc[0].input == {
        "amount": 250, "from_currency": "USD", "to_currency": "EUR"}, wc)
    with client.messages.stream(**kw) as stream:
        partial = [e.delta.partial_json for e in stream if e.type == "content_block_delta" and
                   e.delta.type == "input_json_delta"]
        fs = [b for b in stream.get_final_message().content if b.type == "tool_use"]
    check("tools stream (3 parameters): input_json_delta fragments", len(partial) >= 4, partial)
    check("tools stream (3 parameters): SDK accumulator == not streamed",
          len(fs) == 1 and len(wc) == 1 and fs[0].input == wc[0].input and
          json.loads("".join(partial)) == wc[0].input, (fs, partial))
    status, _, body = server.request("POST", "/v1/chat/completions", {
        "model": "tiny", "messages": ask, "max_tokens": 128, "temperature": 0,
        "tools": [{"type": "function", "function": {
            "name": CONVERT["name"], "description": CONVERT["description"],
            "parameters": CONVERT["input_schema"]}}],
        "chat_template_kwargs": {"enable_thinking": False}})
    oc = json.loads(body)["choices"][0]["message"].get("tool_calls") or [{}]
    check("tools stream (3 parameters): fragments == the OpenAI route's arguments string",
          status == 200 and "".join(partial) == oc[0].get("function", {}).get("arguments"),
          (partial, oc))
    history = user + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                    "content": "09:41"}]}]
    a = client.messages.create(model="tiny", max_tokens=64, messages=history, tools=[GET_TIME],
                               extra_body=T0)
    check("tools: answer after tool_result", a.stop_reason == "end_turn" and bool(text_of(a)), a)
    f = client.messages.create(model="tiny", max_tokens=64, tool_choice={"type": "any"},
                               messages=Q, tools=[GET_TIME], extra_body=T0)
    check("tools: tool_choice any forces a call",
          any(b.type == "tool_use" for b in f.content) and f.stop_reason == "tool_use", f)


def error_checks(client, server):
    import anthropic
    cases = [
        ({"model": "tiny", "messages": Q}, "max_tokens"),
        ({"model": "tiny", "max_tokens": "9", "messages": Q}, "max_tokens"),
        ({"model": "tiny", "max_tokens": 9, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
        ({"model": "tiny", "max_tokens": 9, "messages": Q, "tools": [{"name": "f"}]},
         "tools[0].input_schema"),
        ({"model": "tiny", "max_tokens": 9, "messages": Q, "temperature": 3}, "temperature"),
    ]
    for body, field in cases:
        status, _, raw = server.request("POST", "/v1/messages", body,
                                        {"anthropic-version": "2023-06-01"})
        e = json.loads(raw)
        check(f"error 400 names {field}", status == 400 and e.get("type") == "error" and
              e["error"]["type"] == "invalid_request_error" and field in e["error"]["message"],
              (status, e))
    status, _, raw = server.request("POST", "/messages", b"{not json")
    check("error: bad JSON, Anthropic's shape, without /v1",
          status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error", raw)
    status, _, raw = server.request("POST", "/v1/messages/nope", {})
    check("error: 404 not_found_error", status == 404 and
          json.loads(raw)["error"]["type"] == "not_found_error", (status, raw))
    try:
        client.messages.create(model="tiny", max_tokens=9, messages=[{"role": "user",
                                                                      "content": 5}])
        check("SDK: BadRequestError", False, "accepted")
    except anthropic.BadRequestError as e:
        check("SDK: BadRequestError naming the field", "messages[0].content" in str(e), e)
    still_serves(client, "after errors")


def anthropic_error(status, raw, want_status, want_type):
    """Whether a reply is Anthropic's {"type": "error", "error": {"type", "message"}}."""
    try:
        e = json.loads(raw)
    except ValueError:
        return False
    return (status == want_status and e.get("type") == "error" and
            e.get("error", {}).get("type") == want_type and bool(e["error"].get("message")))


def openai_error(status, raw, want_status):
    try:
        e = json.loads(raw)
    except ValueError:
        return False
    return (status == want_status and "type" not in e and
            isinstance(e.get("error"), dict) and bool(e["error"].get("message")))


def http_error_checks(qwenrt):
    """The errors made before a reply exists (the HTTP layer's 413, routing's 404 / 405, the API
    key's 401, the queue's 429, the request timeout's 504): Anthropic's shape on Anthropic's routes
    (with and without /v1), OpenAI's on OpenAI's. One server: 1 slot, 2 queued, 1 MiB bodies,
    2 s per request, on the ref backend (~170 tok/s here, against ~3,000 on cpu), so a request
    that waited behind timed-out ones cannot finish its ~95-token answer in what is left of its
    time (the server checks deadlines every 0.2 s)."""
    server = Server(qwenrt, "--api-key", "k", "--max-body-mb", "1", "--timeout", "2",
                    parallel=1, max_queue=2, backend="ref")
    key = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    msg = {"model": "tiny", "max_tokens": 8, "messages": Q}
    chat = {"model": "tiny", "max_tokens": 8, "messages": Q}
    try:
        for path in ("/v1/messages", "/messages", "/v1/messages/count_tokens"):
            s, _, raw = server.request("POST", path, msg, {"anthropic-version": "2023-06-01"})
            check(f"401 on {path}: authentication_error",
                  anthropic_error(s, raw, 401, "authentication_error"), (s, raw))
        s, _, raw = server.request("POST", "/v1/chat/completions", chat)
        check("401 on /v1/chat/completions: OpenAI's shape", openai_error(s, raw, 401), (s, raw))

        big = b'{"model": "tiny", "max_tokens": 8, "messages": [], "pad": "' + \
            b"x" * (2 << 20) + b'"}'
        for path in ("/v1/messages", "/messages/count_tokens", "/v1/messages?beta=true"):
            s, _, raw = server.request("POST", path, big, key)
            check(f"413 on {path}: request_too_large",
                  anthropic_error(s, raw, 413, "request_too_large"), (s, raw[:200]))
        s, _, raw = server.request("POST", "/v1/chat/completions", big, key)
        check("413 on /v1/chat/completions: OpenAI's shape", openai_error(s, raw, 413),
              (s, raw[:200]))

        s, _, raw = server.request("POST", "/v1/messages/batches", msg, key)
        check("404 on /v1/messages/batches: not_found_error",
              anthropic_error(s, raw, 404, "not_found_error"), (s, raw))
        s, _, raw = server.request("POST", "/v1/nothing", chat, key)
        check("404 on /v1/nothing: OpenAI's shape", openai_error(s, raw, 404), (s, raw))
        for path in ("/v1/messages", "/messages/count_tokens"):
            s, _, raw = server.request("GET", path, None, key)
            check(f"405 on GET {path}: invalid_request_error",
                  anthropic_error(s, raw, 405, "invalid_request_error"), (s, raw))
        s, _, raw = server.request("GET", "/v1/chat/completions", None, key)
        check("405 on GET /v1/chat/completions: OpenAI's shape", openai_error(s, raw, 405), (s, raw))

        # The slot and the queue full: two long OpenAI streams (stop tokens banned, so they run
        # until the timeout) and an Anthropic request waiting behind them.
        stops = subprocess.run([qwenrt, "tokenize", "-m", MODEL, "--special",
                                "<|im_end|><|endoftext|>"], check=True, capture_output=True,
                               text=True).stdout.split()
        long_chat = {"model": "tiny", "max_tokens": 900, "stream": True, "temperature": 0,
                     "messages": [{"role": "user", "content": "Write a long story."}],
                     "chat_template_kwargs": {"enable_thinking": False},
                     "logit_bias": {t: -100 for t in stops}}
        long_msg = {"model": "tiny", "max_tokens": 900, "temperature": 0,
                    "messages": [{"role": "user", "content": "Write a long story."}]}
        pool = concurrent.futures.ThreadPoolExecutor(4)
        streams = [pool.submit(server.request, "POST", "/v1/chat/completions", long_chat, key)
                   for _ in range(2)]
        deadline = time.time() + 1.0
        while time.time() < deadline and server.metrics(key).get("qwenrt_queue_depth", 0) < 1:
            time.sleep(0.02)
        waiting = pool.submit(server.request, "POST", "/v1/messages", long_msg, key)
        while time.time() < deadline and server.metrics(key).get("qwenrt_queue_depth", 0) < 2:
            time.sleep(0.02)
        # Two waiting (or three, once the running stream timed out and freed its slot).
        full = server.metrics(key).get("qwenrt_queue_depth", 0) >= 2
        s, h, raw = server.request("POST", "/v1/messages", msg, key)
        check("429 on /v1/messages: rate_limit_error with Retry-After",
              full and anthropic_error(s, raw, 429, "rate_limit_error") and
              "Retry-After" in h, (full, s, h, raw))
        s, h, raw = server.request("POST", "/v1/chat/completions", chat, key)
        check("429 on /v1/chat/completions: OpenAI's shape with Retry-After",
              full and openai_error(s, raw, 429) and "Retry-After" in h, (full, s, h, raw))
        s, _, raw = waiting.result(timeout=30)
        check("504 (request timeout) on /v1/messages: timeout_error",
              anthropic_error(s, raw, 504, "timeout_error"), (s, raw))
        for f in streams:
            s, _, raw = f.result(timeout=30)
            events = [json.loads(line[6:]) for line in raw.decode().splitlines()
                      if line.startswith("data: {")]
            check("504 in an OpenAI stream: an error event in OpenAI's shape",
                  s == 200 and any("error" in e and "type" not in e for e in events),
                  (s, events[-2:]))
        pool.shutdown()
    finally:
        server.stop()


def auth_checks(qwenrt):
    import anthropic
    server = Server(qwenrt, "--api-key", "sekrit")
    try:
        bad = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="wrong",
                                  max_retries=0)
        try:
            bad.messages.create(model="tiny", max_tokens=4, messages=Q)
            check("auth: 401", False, "accepted")
        except anthropic.AuthenticationError as e:
            check("auth: 401 authentication_error", e.status_code == 401 and
                  e.body["error"]["type"] == "authentication_error", e.body)
        good = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="sekrit",
                                   max_retries=0)
        r = good.messages.create(model="tiny", max_tokens=4, messages=Q)
        check("auth: x-api-key accepted", r.type == "message", r)
    finally:
        server.stop()


def main():
    args = test_args()
    import anthropic
    print(f"anthropic {anthropic.__version__}")
    t0 = time.time()
    server = Server(args.qwenrt)
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none",
                                     max_retries=0, timeout=120)
        text_checks(client, server, args.qwenrt)
        tool_checks(client, server, args.qwenrt)
        error_checks(client, server)
    finally:
        rc = server.stop()
    check("server: exit 0 on SIGTERM", rc == 0, rc)
    auth_checks(args.qwenrt)
    http_error_checks(args.qwenrt)
    finish(t0)


if __name__ == "__main__":
    main()
