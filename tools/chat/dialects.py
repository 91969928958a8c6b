"""The chat templates the parity checks render with, per dialect.

qwen3.5 is the official template, committed as tests/fixtures/chat/qwen3.5-chat-template.jinja (a
byte-identical copy of shared/fixtures/qwen3.5-chat-template.jinja, so a clean clone has it).
No official Qwen3.6 or Qwen3.8 template exists in this repository, so those two are DERIVED here
from the 3.5 text by exact, asserted substitutions, one per difference we implement (SPEC.md
"Tokenizer and chat", and for the 3.8 wording tools/chat/README.md). They check that the C++
renderer implements those differences and nothing else; they are not evidence of what the
released 3.6/3.8 templates say beyond that.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_NAME = "qwen3.5-chat-template.jinja"


def find_official_template() -> Path:
    """The committed copy; shared/ (inside the checkout or beside it) as a fallback."""
    for candidate in (REPO / "tests" / "fixtures" / "chat" / TEMPLATE_NAME,
                      REPO / "shared" / "fixtures" / TEMPLATE_NAME,
                      REPO.parent / "shared" / "fixtures" / TEMPLATE_NAME):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{TEMPLATE_NAME} not found in {REPO}/shared/fixtures or "
                            f"{REPO.parent}/shared/fixtures")


def _replace_once(text: str, old: str, new: str) -> str:
    count = text.count(old)
    if count != 1:
        raise ValueError(f"derived template: expected the anchor once, found it {count} times: {old!r}")
    return text.replace(old, new)


_KEEP_REASONING_35 = "{%- if loop.index0 > ns.last_query_index %}"


def derive_qwen36(t35: str) -> str:
    # preserve_thinking (default false) keeps the reasoning of every past assistant turn.
    return _replace_once(
        t35, _KEEP_REASONING_35,
        "{%- if (preserve_thinking is defined and preserve_thinking is true) or "
        "(loop.index0 > ns.last_query_index) %}")


_EFFORT_38 = """{%- set resolved_reasoning_effort = reasoning_effort|default('xhigh') %}
{%- if resolved_reasoning_effort not in ('xhigh', 'medium', 'low') %}
    {{- raise_exception('Unexpected reasoning effort ' ~ reasoning_effort ~ '. Supported types are xhigh (default), medium, and low.') }}
{%- endif %}
{%- set reasoning_instructions = '' %}
{%- if not (enable_thinking is defined and enable_thinking is false) %}
    {%- if resolved_reasoning_effort == 'xhigh' %}
        {%- set reasoning_instructions = 'Reasoning effort is set to xhigh. Please think carefully through the task, validate key assumptions, consider plausible alternatives, and prioritize correctness, consistency, and clarity in the final answer.' %}
    {%- elif resolved_reasoning_effort == 'low' %}
        {%- set reasoning_instructions = 'Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the conclusion without unnecessary elaboration.' %}
    {%- endif %}
{%- endif %}
"""


def derive_qwen38(t35: str) -> str:
    t = t35
    # 1. The reasoning-effort instruction, decided before anything is written.
    t = _replace_once(t, "{%- if not messages %}", _EFFORT_38 + "{%- if not messages %}")
    # 2. It opens the tools turn...
    t = _replace_once(
        t, "    {{- '<|im_start|>system\\n' }}\n    {{- \"# Tools",
        "    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if reasoning_instructions %}\n"
        "        {{- reasoning_instructions + '\\n\\n' }}\n"
        "    {%- endif %}\n"
        "    {{- \"# Tools")
    # 3. ...or the system turn, which an empty system message no longer makes on its own.
    t = _replace_once(
        t,
        "{%- else %}\n"
        "    {%- if messages[0].role == 'system' %}\n"
        "        {%- set content = render_content(messages[0].content, false, true)|trim %}\n"
        "        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endif %}",
        "{%- else %}\n"
        "    {%- set content = '' %}\n"
        "    {%- if messages[0].role == 'system' %}\n"
        "        {%- set content = render_content(messages[0].content, false, true)|trim %}\n"
        "    {%- endif %}\n"
        "    {%- if content and reasoning_instructions %}\n"
        "        {{- '<|im_start|>system\\n' + reasoning_instructions + '\\n\\n' + content + '<|im_end|>\\n' }}\n"
        "    {%- elif content %}\n"
        "        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}\n"
        "    {%- elif reasoning_instructions %}\n"
        "        {{- '<|im_start|>system\\n' + reasoning_instructions + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endif %}")
    # 4. Reasoning comes only from reasoning_content; "<think>" inside content stays content.
    t = _replace_once(
        t,
        "        {%- else %}\n"
        "            {%- if '</think>' in content %}\n"
        "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
        "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
        "            {%- endif %}\n",
        "")
    # 5. preserve_thinking defaults to true.
    t = _replace_once(
        t, _KEEP_REASONING_35,
        "{%- if preserve_thinking is undefined or preserve_thinking is true or "
        "loop.index0 > ns.last_query_index %}")
    # 6. Non-string arguments are written as JSON.
    t = _replace_once(
        t,
        "{%- set args_value = args_value | tojson | safe if args_value is mapping or "
        "(args_value is sequence and args_value is not string) else args_value | string %}",
        "{%- set args_value = args_value | string if args_value is string else "
        "args_value | tojson | safe %}")
    return t


def templates() -> dict[str, str]:
    t35 = find_official_template().read_text(encoding="utf-8")
    return {"qwen3.5": t35, "qwen3.6": derive_qwen36(t35), "qwen3.8": derive_qwen38(t35)}


def template_view(messages):
    """The messages as the template sees them: tool-call arguments sent as a JSON string (as OpenAI
    clients do) parsed into a mapping, since the template iterates `arguments|items`. The C++
    renderer reads such strings the same way."""
    messages = copy.deepcopy(messages)
    for message in messages:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                text = fn["arguments"]
                if text.strip():
                    fn["arguments"] = json.loads(text)
                else:
                    del fn["arguments"]
    return messages
