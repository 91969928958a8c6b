#!/usr/bin/env python3
"""Chat templates: qwenrt's C++ renderer and reply parser against jinja2 running the templates the
way HF transformers does (tools/chat/hf_render.py).

  1. Regenerates the expectations of tests/fixtures/chat/renders.json with jinja2 and requires them
     to equal the committed ones (so the fixtures are what the pinned jinja2 renders today).
  2. Renders seeded random conversations (tools/chat/random_chats.py) in all three dialects with
     random options, with jinja2 and with the C++ renderer (qwenrt_chat_tool render): the texts
     must be identical, and where the template refuses a conversation C++ must refuse it too.
  3. Round trip: assistant turns rendered by the templates are parsed back by the C++ reply parser
     (qwenrt_chat_tool parse) into the reasoning, content and tool calls they were made from.
Exits 1 on any mismatch.

Usage: chat_template_parity.py --tool PATH/qwenrt_chat_tool [--count N] [--seed S]
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "chat"))

try:
    import jinja2
except ImportError:
    sys.exit("chat_template_parity: jinja2 is missing; pip install -r tools/requirements.txt")

import dialects  # noqa: E402
import hf_render  # noqa: E402
import make_render_fixtures  # noqa: E402
import random_chats  # noqa: E402


def run_tool(tool: Path, command: str, cases: list) -> list:
    with tempfile.TemporaryDirectory() as work:
        cases_path, out_path = Path(work) / "cases.json", Path(work) / "out.json"
        cases_path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
        subprocess.run([str(tool), command, str(cases_path), str(out_path)], check=True)
        return json.loads(out_path.read_text(encoding="utf-8"))


def show(text: str, limit=300) -> str:
    return json.dumps(text[:limit], ensure_ascii=False)


def check_fixtures() -> int:
    committed = json.loads((REPO / "tests/fixtures/chat/renders.json").read_text(encoding="utf-8"))
    fresh = make_render_fixtures.build_cases(hf_render.render)
    failures = 0
    if len(fresh) != len(committed["cases"]):
        print(f"FIXTURES: {len(fresh)} cases generated, {len(committed['cases'])} committed; "
              "run tools/chat/make_render_fixtures.py")
        return 1
    for mine, theirs in zip(fresh, committed["cases"]):
        if mine != theirs:
            failures += 1
            if failures <= 5:
                print(f"FIXTURE DRIFT {mine['dialect']} {mine['conversation']} {mine['options']}")
    print(f"fixtures: {len(fresh) - failures} of {len(fresh)} committed renders reproduced by "
          f"jinja2 {jinja2.__version__}")
    return failures


def check_random(tool: Path, count: int, seed: int) -> int:
    rng = random.Random(seed)
    templates = dialects.templates()
    cases, expected = [], []
    for _ in range(count):
        messages, tools, options = random_chats.conversation(rng)
        for dialect, template in templates.items():
            case_options = dict(options)
            cases.append({"dialect": dialect, "messages": messages, "tools": tools,
                          "options": case_options})
            try:
                expected.append(hf_render.render(template, dialects.template_view(messages),
                                                 tools=tools, **case_options))
            except hf_render.TemplateError as error:
                expected.append(error)
    results = run_tool(tool, "render", cases)
    failures = refused = 0
    for case, want, got in zip(cases, expected, results):
        if isinstance(want, Exception):
            refused += 1
            ok = "error" in got
        else:
            ok = got.get("text") == want
        if not ok:
            failures += 1
            if failures <= 5:
                print(f"RENDER MISMATCH {case['dialect']} options={case['options']}\n"
                      f"  messages={json.dumps(case['messages'], ensure_ascii=False)[:600]}\n"
                      f"  jinja2: {want if isinstance(want, Exception) else show(want, 2000)}\n"
                      f"  C++:    {got}")
    print(f"random: {len(cases) - failures} of {len(cases)} renders identical "
          f"({count} conversations x 3 dialects, {refused} refused by both)")
    return failures


def schema_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def check_round_trip(tool: Path, count: int, seed: int) -> int:
    """Rendered assistant turns parse back into what they were rendered from."""
    rng = random.Random(seed + 1)
    templates = dialects.templates()
    words = [w for w in random_chats.WORDS if "<" not in w and ">" not in w]
    cases, expected = [], []
    for i in range(count):
        reasoning = random_chats.text(rng, words)
        content = random_chats.text(rng, words)
        calls = []  # distinct names, so each call has its own schema
        for name in rng.sample(["get_weather", "search", "名前"], rng.randint(0, 3)):
            arguments = {f"p{k}": random_chats.value(rng) for k in range(rng.randint(0, 4))}
            calls.append({"name": name, "arguments": arguments})
        messages = [{"role": "user", "content": "q"},
                    {"role": "assistant", "content": content, "reasoning_content": reasoning,
                     "tool_calls": [{"type": "function", "function": c} for c in calls]}]
        # 3.8 with schemas typed after the values: the parser must give the values back as JSON.
        # 3.5 without tools: the parser gives the text the template wrote (str() or tojson).
        dialect = "qwen3.8" if i % 2 else "qwen3.5"
        tools = None
        if dialect == "qwen3.8":
            tools = [{"type": "function", "function": {"name": c["name"], "parameters": {
                "type": "object",
                "properties": {k: {"type": schema_type(v)} for k, v in c["arguments"].items()}}}}
                for c in calls]
        text = hf_render.render(templates[dialect], messages, tools=tools,
                                add_generation_prompt=False, reasoning_effort="medium")
        opener = "<|im_start|>assistant\n<think>\n"  # the reply starts inside the think block
        reply = text[text.rindex(opener) + len(opener):-len("<|im_end|>\n")]
        cases.append({"text": reply, "starts_in_reasoning": True, "tools": tools})

        def written(v):
            if isinstance(v, str) or dialect == "qwen3.8":
                return v
            return json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)

        expected.append({"reasoning": reasoning.strip(), "content": content.strip(),
                         "tool_calls": [{"name": c["name"], "complete": True,
                                         "arguments": {k: written(v)
                                                       for k, v in c["arguments"].items()}}
                                        for c in calls]})
    results = run_tool(tool, "parse", cases)
    failures = 0
    for case, want, got in zip(cases, expected, results):
        if got != want:
            failures += 1
            if failures <= 5:
                print(f"ROUND TRIP MISMATCH\n  reply: {show(case['text'], 1000)}\n"
                      f"  want: {json.dumps(want, ensure_ascii=False)}\n"
                      f"  got:  {json.dumps(got, ensure_ascii=False)}")
    print(f"round trip: {len(cases) - failures} of {len(cases)} rendered replies parsed back")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", type=Path, required=True, help="qwenrt_chat_tool binary")
    parser.add_argument("--count", type=int, default=600, help="random conversations")
    parser.add_argument("--seed", type=int, default=20261129)
    args = parser.parse_args()
    failures = check_fixtures()
    failures += check_random(args.tool, args.count, args.seed)
    failures += check_round_trip(args.tool, args.count, args.seed)
    print("chat_template_parity: " + ("OK" if failures == 0 else f"{failures} FAILED"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
