#!/usr/bin/env python3
"""`qwenrt serve`'s prefix cache on the embedded tiny chat model, through the official SDKs:
  a conversation resent whole each turn (a tool call and its result in the history) reports
  cached tokens on every turn after the first (OpenAI usage.prompt_tokens_details.cached_tokens)
  and prefills at most the turn's new tokens plus one page; the greedy replies equal those of a
  server with --prefix-cache off; a second client with the same system prompt hits too; n > 1
  reports its siblings' shared prefix; Anthropic's usage: input_tokens + cache_read_input_tokens
  == count_tokens; /metrics counts hits and holds cached pages that are not a sequence's.
Prints one line per check; exits 1 on any failure.

Usage: test_serve_prefix_cache.py --qwenrt PATH/qwenrt [--tool ...]
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve_openai import (GET_TIME, Server, check, finish,  # noqa: E402
                               test_args)

PAGE = 64
SYSTEM = ("You are a careful assistant. You answer in one short sentence, you check the local "
          "time with the get_time tool when asked about time, and you never guess. " * 3)


def conversation_turns(client, n_turns, extra=None):
    """Replays one conversation; returns per turn (reply text, usage)."""
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(n_turns):
        messages.append({"role": "user", "content": f"Question {t}: what time is it in city {t}?"})
        r = client.chat.completions.create(
            model="tiny", messages=messages, tools=[GET_TIME], max_tokens=12, temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}, **(extra or {})})
        out.append((r.choices[0].message.content or "", r.usage))
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        if t % 2 == 0:  # a scripted tool round in the history
            call = {"id": f"call_{t}", "type": "function",
                    "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{t}", "content": "09:41"})
    return out


def cached_of(usage):
    details = usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details else 0


def openai_checks(qwenrt):
    import openai
    runs = {}
    for mode in ("off", "on"):
        server = Server(qwenrt, "--prefix-cache", mode, parallel=2)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none",
                                   max_retries=0, timeout=120)
            runs[mode] = conversation_turns(client, 5)
            if mode == "on":
                m = server.metrics()
                check("metrics: hits counted", m.get("qwenrt_prefix_cache_hits_total", 0) >= 4, m)
                check("metrics: entries and pages held by the cache after the turns",
                      m.get("qwenrt_prefix_cache_entries", 0) > 0 and
                      m.get("qwenrt_prefix_cache_kv_pages", 0) > 0 and
                      m.get("qwenrt_kv_pages_in_use", -1) == 0, m)
                # Another client, same system prompt and tools: resumes from the shared part.
                other = client.chat.completions.create(
                    model="tiny", max_tokens=4, temperature=0, tools=[GET_TIME],
                    messages=[{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": "Something else entirely?"}],
                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                check("another client with the same system prompt hits",
                      cached_of(other.usage) >= PAGE, other.usage)
                # n > 1: the siblings prefill their prompt once.
                many = client.chat.completions.create(
                    model="tiny", max_tokens=4, temperature=0, n=3,
                    messages=[{"role": "user", "content": "A brand new question about rivers " * 12}])
                check("n = 3: cached tokens reported for the siblings' shared prompt",
                      cached_of(many.usage) > 0, many.usage)
        finally:
            server.stop()
    off, on = runs["off"], runs["on"]
    check("cache off: no cached tokens", all(cached_of(u) == 0 for _, u in off),
          [cached_of(u) for _, u in off])
    check("greedy replies equal with the cache on and off", [t for t, _ in on] == [t for t, _ in off],
          ([t for t, _ in on], [t for t, _ in off]))
    for t in range(1, len(on)):
        prompt, cached = on[t][1].prompt_tokens, cached_of(on[t][1])
        new = prompt - on[t - 1][1].prompt_tokens
        check(f"turn {t}: prefilled {prompt - cached} <= new {new} + one page",
              cached > 0 and prompt - cached <= new + PAGE and prompt == off[t][1].prompt_tokens,
              (prompt, cached, new))


def anthropic_checks(qwenrt):
    import anthropic
    server = Server(qwenrt, parallel=2)
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none",
                                     max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Tell me about the sea in one sentence."}]
        first = client.messages.create(model="tiny", max_tokens=8, system=SYSTEM,
                                       messages=messages, extra_body={"temperature": 0})
        messages += [{"role": "assistant", "content": first.content[0].text or "ok"},
                     {"role": "user", "content": "And the hills?"}]
        second = client.messages.create(model="tiny", max_tokens=8, system=SYSTEM,
                                        messages=messages, extra_body={"temperature": 0})
        counted = client.messages.count_tokens(model="tiny", system=SYSTEM, messages=messages)
        u = second.usage
        check("anthropic: second turn reads the cache", u.cache_read_input_tokens > 0, u)
        check("anthropic: input_tokens + cache_read_input_tokens == count_tokens",
              u.input_tokens + u.cache_read_input_tokens == counted.input_tokens,
              (u, counted.input_tokens))
    finally:
        server.stop()


def main():
    args = test_args()
    t0 = time.time()
    openai_checks(args.qwenrt)
    anthropic_checks(args.qwenrt)
    finish(t0)


if __name__ == "__main__":
    main()
