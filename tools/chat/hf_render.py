"""Renders a chat template the way HF transformers' apply_chat_template(..., tokenize=False) does.

Mirrors transformers 5.24.0 (checked against it: see VERIFIED below):
  - tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template: an empty conversation is
    an error; each message drops its keys whose value is None (_normalize_chat_messages);
  - utils/chat_template_utils.render_jinja_template: a message's `reasoning_content` is filled from
    `thinking` or `reasoning` when absent (_alias_reasoning_fields); the template gets
    messages, tools, documents, add_generation_prompt and the extra keyword arguments;
  - utils/chat_template_utils._cached_compile_jinja_template: ImmutableSandboxedEnvironment with
    trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; `tojson` replaced by
    json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False);
    raise_exception, strftime_now, dict and namespace globals.
Left out, because the Qwen templates use none of them: the {% generation %} tag (assistant masks),
continue_final_message, the tokenizer's special tokens passed as template variables (bos_token...),
tools given as Python callables, and the rich-object sanitising (_plain_template_data is the
identity on data loaded from JSON).

VERIFIED: tools/chat/make_render_fixtures.py --check-transformers renders every committed case with
both this module and transformers 5.24.0's own functions (render_jinja_template after
_normalize_chat_messages, no torch needed) and requires identical text or both raising; on
2026-11-29 all 450 cases of tests/fixtures/chat/renders.json (65 conversations x option sets x
three templates, 38 of them refusals) agreed, transformers 5.24.0 with jinja2 3.1.6.

Needs only jinja2 (pinned in tools/requirements.txt).
"""
from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

TRANSFORMERS_VERSION = "5.24.0"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(Exception):
    """The template (or the preprocessing before it) refused the conversation."""


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {name!r}")


_compiled: dict[str, jinja2.Template] = {}


def compile_template(template_text: str) -> jinja2.Template:
    if template_text not in _compiled:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.globals["dict"] = _TemplateDict()
        env.globals["namespace"] = _TemplateNamespace
        _compiled[template_text] = env.from_string(template_text)
    return _compiled[template_text]


def _prepare_messages(messages):
    if isinstance(messages, (list, tuple)) and len(messages) == 0:
        raise TemplateError("Cannot apply chat template to an empty conversation.")
    prepared = []
    for message in messages:
        if not isinstance(message, dict):
            raise TemplateError(f"Chat messages should be dicts, got {message!r}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def render(template_text: str, messages, tools=None, add_generation_prompt=False, **kwargs) -> str:
    """apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=...,
    **kwargs). Raises TemplateError where transformers would raise."""
    prepared = _prepare_messages(messages)
    try:
        return compile_template(template_text).render(
            messages=prepared, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **kwargs)
    except (jinja2.exceptions.TemplateError, TypeError, ValueError) as error:
        raise TemplateError(str(error)) from error


def render_with_transformers(template_text: str, messages, tools=None, add_generation_prompt=False,
                             **kwargs) -> str:
    """The same through transformers' own functions (for the one-off cross-check of this module)."""
    from transformers.utils.chat_template_utils import (_normalize_chat_messages,
                                                        render_jinja_template)
    if isinstance(messages, list) and len(messages) == 0:
        raise TemplateError("Cannot apply chat template to an empty conversation.")
    try:
        conversations = [_normalize_chat_messages(messages)]
        rendered, _ = render_jinja_template(conversations=conversations, tools=tools,
                                            chat_template=template_text,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
    except (jinja2.exceptions.TemplateError, TypeError, ValueError) as error:
        raise TemplateError(str(error)) from error
    return rendered[0]
