"""Seeded random conversations for tests/python/chat_template_parity.py.

Each conversation mixes the constructs of the template at random: system (string, parts, empty),
user turns (strings, parts, Unicode and odd whitespace, wrapped tool responses), assistant turns
(reasoning_content, the `reasoning`/`thinking` aliases, inline <think>, none), tool calls
(wrapped or bare, arguments as objects or JSON strings, every JSON value type), runs of tool
responses, tools lists, and render options; a few are deliberately invalid.
"""
from __future__ import annotations

import json
import random

WORDS = ["hello", "world", "naïve", "café", "中文", "日本語", "😀", "👍🏽", "עברית", "é", "x<y", "a>b",
         "{json}", "\"quoted\"", "back\\slash", "tab\there", "<b>", "&amp;", "1.5", "True", "None"]
EDGE_SPACE = ["", " ", "\n", "\n\n", "\t", "\u3000", "\u00a0", "\u2028", " \n ", "\u200b"]


def text(rng: random.Random, words=WORDS, max_words=8) -> str:
    n = rng.randint(0, max_words)
    seps = [" ", " ", " ", "\n", "  ", "\n\n"]
    body = "".join((rng.choice(seps) if i else "") + rng.choice(words) for i in range(n))
    return rng.choice(EDGE_SPACE) + body + rng.choice(EDGE_SPACE)


def content(rng: random.Random, words=WORDS):
    r = rng.random()
    if r < 0.75:
        return text(rng, words)
    if r < 0.9:
        return [{"type": "text", "text": text(rng, words)} for _ in range(rng.randint(1, 3))]
    return None


FLOATS = [0.0, -0.0, 1.0, 0.1, 2.5, 1e16, 1e15, 1e-5, 1e-4, 1e22, 1e300, 5e-324, 123456.789,
          0.30000000000000004, -7.25, 1.7976931348623157e308]


def value(rng: random.Random, depth=0):
    r = rng.random()
    if r < 0.35 or depth > 2:
        return text(rng)
    if r < 0.45:
        return rng.randint(-10**12, 10**12)
    if r < 0.55:
        return rng.choice(FLOATS) if rng.random() < 0.5 else rng.uniform(-1, 1) * 10 ** rng.randint(-9, 20)
    if r < 0.62:
        return rng.random() < 0.5
    if r < 0.67:
        return None
    if r < 0.83:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["k", "name", "ключ", "a b", "x"]) + str(i): value(rng, depth + 1)
            for i in range(rng.randint(0, 3))}


def tool_definition(rng: random.Random, name: str) -> dict:
    properties = {f"p{i}": {"type": rng.choice(["string", "integer", "number", "boolean", "object",
                                                "array"]),
                            "description": text(rng, max_words=4)}
                  for i in range(rng.randint(0, 4))}
    function = {"name": name, "description": text(rng),
                "parameters": {"type": "object", "properties": properties,
                               "required": sorted(properties)[:1]}}
    if rng.random() < 0.3:
        function["parameters"]["properties"]["limit"] = {"type": "number", "default": value(rng)}
    return function if rng.random() < 0.2 else {"type": "function", "function": function}


def tool_call(rng: random.Random, names) -> dict:
    arguments = {f"p{i}" if rng.random() < 0.8 else text(rng, max_words=1).strip() or "q":
                 value(rng) for i in range(rng.randint(0, 4))}
    if rng.random() < 0.3:
        arguments = json.dumps(arguments, ensure_ascii=rng.random() < 0.5)
    fn = {"name": rng.choice(names), "arguments": arguments}
    if rng.random() < 0.1:
        del fn["arguments"]
    return {"type": "function", "function": fn} if rng.random() < 0.8 else fn


def assistant(rng: random.Random, names, calls: bool) -> dict:
    message = {"role": "assistant", "content": content(rng)}
    r = rng.random()
    if r < 0.45:
        message["reasoning_content"] = text(rng)
    elif r < 0.55:
        message[rng.choice(["reasoning", "thinking"])] = text(rng)
    elif r < 0.75 and isinstance(message["content"], str):
        message["content"] = (rng.choice(["", "<think>", "<think>\n"]) + text(rng) +
                              rng.choice(["</think>", "\n</think>\n\n"]) + message["content"])
    if calls:
        message["tool_calls"] = [tool_call(rng, names) for _ in range(rng.randint(1, 3))]
    return message


def conversation(rng: random.Random):
    """(messages, tools, options) for one random conversation."""
    names = ["get_weather", "search", "run", "名前"]
    tools = [tool_definition(rng, name) for name in rng.sample(names, rng.randint(0, 3))]
    if rng.random() < 0.3:
        tools = None
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(["", " \n ", text(rng),
                                                                  [{"type": "text", "text": text(rng)}]])})
    for turn in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": content(rng)})
        if rng.random() < 0.2:
            messages.append({"role": "user", "content": "<tool_response>\n" + text(rng) +
                                                        "\n</tool_response>"})
        for _ in range(rng.randint(0, 2)):  # tool rounds
            messages.append(assistant(rng, names, calls=True))
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "tool", "content": content(rng)})
        if rng.random() < 0.8:
            messages.append(assistant(rng, names, calls=False))
    r = rng.random()
    if r < 0.03:
        messages.insert(rng.randint(1, len(messages)), {"role": "system", "content": "late"})
    elif r < 0.05:
        messages.append({"role": rng.choice(["developer", "function", "bot"]), "content": "x"})
    elif r < 0.07:
        messages = [m for m in messages if m["role"] != "user"] or [{"role": "system", "content": "s"}]
    options = {"add_generation_prompt": rng.random() < 0.7}
    if rng.random() < 0.5:
        options["enable_thinking"] = rng.random() < 0.5
    if rng.random() < 0.5:
        options["preserve_thinking"] = rng.random() < 0.5
    if rng.random() < 0.5:
        options["reasoning_effort"] = rng.choice(["xhigh", "medium", "low", "xhigh", "medium", "low",
                                                  "high"])
    return messages, tools, options
