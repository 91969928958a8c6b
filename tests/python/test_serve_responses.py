#!/usr/bin/env python3
"""`qwenrt serve`'s OpenAI Responses API (/v1/responses, stateless) on the embedded tiny chat
model (cpu backend), driven with the pinned `openai` SDK:
  text with reasoning off, a reasoning item (reasoning_text) with thinking on and its
  reasoning_tokens, usage.input_tokens == `qwenrt template` + `qwenrt tokenize`, streaming events
  parsed by the SDK (its responses.stream() accumulator) with deltas == the whole response, a
  function call round trip (function_call -> function_call_output -> answer), streamed arguments
  == whole arguments (a three-parameter call in several deltas, through the SDK's accumulator),
  max_output_tokens -> incomplete, previous_response_id -> 400 naming it, and
  the server still serving after each error.
Prints one line per check; exits 1 on any failure.

Usage: test_serve_responses.py --qwenrt PATH/qwenrt [--tool ...]
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve_openai import (Server, check, finish,  # noqa: E402
                               rendered_prompt_tokens, test_args)

GET_TIME = {"type": "function", "name": "get_time", "description": "Get the local time in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}
GET_TIME_CHAT = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city.",
    "parameters": GET_TIME["parameters"]}}
CONVERT = {"type": "function", "name": "convert_currency",
           "description": "Convert an amount of money between currencies.",
           "parameters": {"type": "object", "properties": {
               "amount": {"type": "number"}, "from_currency": {"type": "string"},
               "to_currency": {"type": "string"}},
               "required": ["amount", "from_currency", "to_currency"]}}
QUESTION = "What is 12 + 7?"
OFF = {"effort": "none"}


def text_checks(client, qwenrt):
    r = client.responses.create(model="tiny", input=QUESTION, reasoning=OFF, temperature=0,
                                max_output_tokens=64)
    check("text: answer, completed", "19" in r.output_text and r.status == "completed", r)
    check("text: no reasoning item with effort none",
          [o.type for o in r.output] == ["message"], r.output)
    n = rendered_prompt_tokens(qwenrt, [{"role": "user", "content": QUESTION}], think=False)
    check("text: usage.input_tokens == tokenize(rendered)", r.usage.input_tokens == n and
          r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, (r.usage, n))
    check("text: ids", r.id.startswith("resp_") and r.object == "response", r)

    w = client.responses.create(model="tiny", input=QUESTION, temperature=0,
                                max_output_tokens=250, instructions="Answer briefly.")
    kinds = [o.type for o in w.output]
    check("thinking: reasoning item, then message", kinds == ["reasoning", "message"], kinds)
    if kinds and kinds[0] == "reasoning":
        check("thinking: reasoning_text content", bool(w.output[0].content[0].text) and
              w.output[0].content[0].type == "reasoning_text", w.output[0])
    check("thinking: reasoning_tokens counted",
          0 < w.usage.output_tokens_details.reasoning_tokens < w.usage.output_tokens, w.usage)
    with client.responses.stream(model="tiny", input=QUESTION, temperature=0,
                                 max_output_tokens=250, instructions="Answer briefly.") as stream:
        events = list(stream)
        s = stream.get_final_response()
    seq = [e.sequence_number for e in events]
    check("stream: sequence numbers 0..n", seq == list(range(len(events))), seq[:5])
    types = [e.type for e in events]
    check("stream: created, in_progress ... completed",
          types[:2] == ["response.created", "response.in_progress"] and
          types[-1] == "response.completed", types[:3])
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    check("stream: text deltas == not streamed", deltas == w.output_text == s.output_text,
          (deltas, w.output_text))
    check("stream: reasoning deltas == not streamed",
          kinds[:1] == ["reasoning"] and reasoning == w.output[0].content[0].text, reasoning)
    check("stream: usage == not streamed", s.usage.output_tokens == w.usage.output_tokens, s.usage)

    cut = client.responses.create(model="tiny", input=QUESTION, reasoning=OFF, temperature=0,
                                  max_output_tokens=3)
    check("max_output_tokens: incomplete", cut.status == "incomplete" and
          cut.incomplete_details.reason == "max_output_tokens" and cut.usage.output_tokens == 3,
          cut)


def tool_checks(client, qwenrt):
    ask = "Tell me the time in Chicago."
    r = client.responses.create(model="tiny", input=ask, tools=[GET_TIME], reasoning=OFF,
                                temperature=0, max_output_tokens=128)
    calls = [o for o in r.output if o.type == "function_call"]
    check("tools: one function_call", len(calls) == 1, r.output)
    if not calls:
        return
    call = calls[0]
    check("tools: name, arguments, call_id", call.name == "get_time" and
          '"Chicago"' in call.arguments and call.call_id.startswith("call_"), call)
    check("tools: usage.input_tokens with tools == tokenize(rendered)",
          r.usage.input_tokens == rendered_prompt_tokens(
              qwenrt, [{"role": "user", "content": ask}], [GET_TIME_CHAT], think=False), r.usage)
    with client.responses.stream(model="tiny", input=ask, tools=[GET_TIME], reasoning=OFF,
                                 temperature=0, max_output_tokens=128) as stream:
        events = list(stream)
    fragments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    check("tools stream: argument deltas == whole arguments",
          fragments == call.arguments and done == [call.arguments], (fragments, call.arguments))
    # Three parameters: several argument deltas, accumulated by the SDK to the whole arguments.
    kw = dict(model="tiny", input="Convert 250 USD to EUR.", tools=[CONVERT], reasoning=OFF,
              temperature=0, max_output_tokens=128)
    wc = [o for o in client.responses.create(**kw).output if o.type == "function_call"]
    with client.responses.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        sc = [o for o in stream.get_final_response().output if o.type == "function_call"]
    check("tools stream (3 parameters): several deltas == whole arguments, same JSON",
          len(wc) == 1 and len(deltas) >= 4 and "".join(deltas) == wc[0].arguments and
          json.loads(wc[0].arguments) == {"amount": 250, "from_currency": "USD",
                                          "to_currency": "EUR"}, (deltas, wc))
    check("tools stream (3 parameters): SDK accumulator == not streamed",
          len(sc) == 1 and len(wc) == 1 and sc[0].arguments == wc[0].arguments and
          sc[0].name == wc[0].name, (sc, wc))
    history = [{"role": "user", "content": ask},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "09:41"}]
    a = client.responses.create(model="tiny", input=history, tools=[GET_TIME], reasoning=OFF,
                                temperature=0, max_output_tokens=64)
    check("tools: answer after function_call_output",
          a.status == "completed" and bool(a.output_text) and
          not any(o.type == "function_call" for o in a.output), a.output)


def error_checks(client, server):
    import openai
    for kwargs, field in [({"previous_response_id": "resp_123"}, "previous_response_id"),
                          ({"tool_choice": "required"}, "tool_choice"),
                          ({"reasoning": {"effort": "extreme"}}, "reasoning.effort")]:
        try:
            client.responses.create(model="tiny", input=QUESTION, **kwargs)
            check(f"error: {field} -> 400", False, "accepted")
        except openai.BadRequestError as e:
            check(f"error: {field} -> 400 naming it",
                  e.status_code == 400 and field in e.message and
                  e.body.get("param") == field, e.body)
        r = client.responses.create(model="tiny", input=QUESTION, reasoning=OFF, temperature=0,
                                    max_output_tokens=8)
        check(f"error: {field}: server still serves", r.usage.output_tokens > 0, r)


def main():
    args = test_args()
    import openai
    print(f"openai {openai.__version__}")
    t0 = time.time()
    server = Server(args.qwenrt)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        text_checks(client, args.qwenrt)
        tool_checks(client, args.qwenrt)
        error_checks(client, server)
    finally:
        rc = server.stop()
    check("server: exit 0 on SIGTERM", rc == 0, rc)
    finish(t0)


if __name__ == "__main__":
    main()
