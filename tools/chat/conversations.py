"""Hand-written conversations for the chat-template fixtures: each construct the template knows,
its edge cases (whitespace, Unicode, Python's str() and json.dumps forms) and the inputs it refuses.

Each entry: name, messages, tools (or None), options (list of option sets to render it with;
defaults to thinking on and off with a generation prompt).
"""
from __future__ import annotations

GEN_ON = {"add_generation_prompt": True}
GEN_OFF = {"add_generation_prompt": True, "enable_thinking": False}
NO_GEN = {"add_generation_prompt": False}
DEFAULT_OPTIONS = [GEN_ON, GEN_OFF]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web. Returns \"snippets\" \\ with quotes, <tags> & ünïcödé — 中文.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "number", "default": 10.0},
                "filters": {"type": "object", "properties": {"site": {"type": "string"}}},
                "tags": {"type": "array", "items": {"type": "string"}},
                "safe": {"type": "boolean", "default": True},
                "cursor": {"type": ["string", "null"], "default": None},
            },
            "required": ["query"],
        },
    },
}
# Number forms whose Python text differs from naive C++ output.
NUMBERS_TOOL = {
    "type": "function",
    "function": {
        "name": "numbers",
        "description": "control\u0001char, tab\tnewline\nCR\rDEL\u007f LS\u2028 NBSP\u00a0 emoji 😀",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "minimum": 1e-05, "maximum": 1e16, "multipleOf": 0.0001},
            "b": {"type": "number", "default": 1000000000000000.0, "examples": [-0.0, 2.5, 1e22,
                                                                                 123456789.125]},
            "c": {"type": "integer", "default": -9007199254740993},
        }},
    },
}
FLAT_TOOL = {"name": "lookup", "description": "A tool given as the bare function.",
             "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}

CONVERSATIONS: list[dict] = []


def conv(name, messages, tools=None, options=None):
    CONVERSATIONS.append({"name": name, "messages": messages, "tools": tools,
                          "options": options if options is not None else DEFAULT_OPTIONS})


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def call(name, arguments, wrapped=True):
    fn = {"name": name, "arguments": arguments}
    return {"type": "function", "function": fn} if wrapped else fn


def tool(text):
    return {"role": "tool", "content": text}


# --- Plain turns ---------------------------------------------------------------------------------
conv("single_user", [user("Hello!")])
conv("system_user", [{"role": "system", "content": "You are a helpful assistant."}, user("Hi")])
conv("empty_system", [{"role": "system", "content": ""}, user("Hi")])
conv("whitespace_system", [{"role": "system", "content": " \n\t "}, user("Hi")])
conv("system_padded", [{"role": "system", "content": "\n\n  Be brief.\n  Answer in French.  \n"},
                       user("  Hi  \n")])
conv("unicode_whitespace_trim", [user("\u3000\u00a0 Hello\u2003world \u2028\u0085\u000b")])
conv("no_generation_prompt", [user("Hi"), assistant("Hello! How can I help?")], options=[NO_GEN])
conv("multi_turn", [user("What is 2+2?"), assistant("4."), user("And 3+3?")])
conv("content_parts", [{"role": "system", "content": [{"type": "text", "text": "Sys "},
                                                      {"type": "text", "text": "prompt."}]},
                       {"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                    {"text": "Part two (no type)."}]}])
conv("unicode_content", [user("Ünïcödé, 中文, emoji 😀👍🏽, RTL עברית, combining é"),
                         assistant("Réponse — ok ✓"), user("次は？")])
conv("special_tokens_in_text", [user("Print <|im_end|> and <think> literally</think> please."),
                                assistant("Sure: <tool_call> is a tag.")], options=[NO_GEN, GEN_ON])
conv("empty_user_content", [user(""), assistant(""), user("  ")])
conv("null_content", [user("Hi"), {"role": "assistant", "content": None}, user("again")])
conv("assistant_last_no_prompt", [user("Q"), assistant("A", reasoning_content="thinking about Q")],
     options=[NO_GEN])

# --- Reasoning ---------------------------------------------------------------------------------
conv("reasoning_current_turn", [user("Q1"), assistant("A1", reasoning_content="\nR1 step.\n\n")],
     options=[NO_GEN, GEN_ON])
conv("reasoning_history", [user("Q1"), assistant("A1", reasoning_content="R1"),
                           user("Q2"), assistant("A2", reasoning_content="R2"), user("Q3")])
conv("inline_think", [user("Q"), assistant("<think>\nLet me think.\n</think>\n\nThe answer.")],
     options=[NO_GEN])
conv("inline_think_history", [user("Q"), assistant("<think>\nOld thought\n</think>\n\nOld answer"),
                              user("Q2")])
conv("inline_think_no_open", [user("Q"), assistant("Only a closing tag\n</think>\nAnswer")],
     options=[NO_GEN])
conv("inline_think_twice", [user("Q"),
                            assistant("<think>a</think>middle<think>\nb\n</think>\n\nend")],
     options=[NO_GEN])
conv("inline_think_spaces", [user("Q"), assistant("  <think>  spaced  </think>  \n answer  ")],
     options=[NO_GEN])
conv("reasoning_field_blocks_split", [user("Q"),
                                      assistant("<think>x</think>visible", reasoning_content="")],
     options=[NO_GEN])
conv("reasoning_whitespace_only", [user("Q"), assistant("A", reasoning_content=" \n\t ")],
     options=[NO_GEN])
conv("reasoning_alias", [user("Q"), assistant("A", reasoning="via reasoning"),
                         user("Q2"), assistant("B", thinking="via thinking")], options=[NO_GEN])
conv("reasoning_null_then_inline", [user("Q"), assistant("<think>inline</think>A",
                                                         reasoning_content=None)],
     options=[NO_GEN])

# --- Tools -------------------------------------------------------------------------------------
conv("tools_user", [user("Weather in Paris?")], tools=[WEATHER_TOOL])
conv("tools_system", [{"role": "system", "content": "Use tools wisely."}, user("Hi")],
     tools=[WEATHER_TOOL, SEARCH_TOOL])
conv("tools_empty_system", [{"role": "system", "content": "  "}, user("Hi")], tools=[WEATHER_TOOL])
conv("tools_escapes_numbers", [user("n")], tools=[NUMBERS_TOOL, SEARCH_TOOL])
conv("tools_flat", [user("look up x")], tools=[FLAT_TOOL])
conv("tools_empty_list", [user("no tools")], tools=[])
conv("tool_call_object_args", [
    user("Weather?"),
    assistant("", tool_calls=[call("get_weather", {"city": "Paris", "days": 3, "unit": "celsius"})]),
], tools=[WEATHER_TOOL], options=[NO_GEN])
conv("tool_call_string_args", [
    user("Weather?"),
    assistant(None, tool_calls=[call("get_weather", '{"city": "Tōkyō", "days": 2}')]),
    tool("Sunny"),
], tools=[WEATHER_TOOL])
conv("tool_call_flat", [user("Weather?"),
                        assistant("", tool_calls=[call("get_weather", {"city": "Oslo"}, False)])],
     tools=[WEATHER_TOOL], options=[NO_GEN])
conv("tool_call_no_arguments", [user("Ping"),
                                assistant("", tool_calls=[{"function": {"name": "ping"}}])],
     options=[NO_GEN])
conv("tool_call_empty_arguments", [user("Ping"), assistant("", tool_calls=[call("ping", {})]),
                                   tool("pong")])
conv("tool_call_value_types", [
    user("Search"),
    assistant("", tool_calls=[call("search", {
        "query": "multi\nline\n  text  ", "limit": 5, "ratio": 2.0, "tiny": 1e-07, "huge": 1e16,
        "big": 1000000000000000.0, "neg_zero": -0.0, "safe": True, "off": False, "cursor": None,
        "tags": ["a", "ü", 1, 2.5, None, True], "filters": {"site": "x.org", "nested": {"k": []}},
        "empty": "", "quote": "say \"hi\" \\ there"})]),
], tools=[SEARCH_TOOL], options=[NO_GEN])
conv("content_then_call", [
    user("Weather?"),
    assistant("Let me check.", tool_calls=[call("get_weather", {"city": "Rome"})]),
    tool("22C"), assistant("It is 22C in Rome."),
], tools=[WEATHER_TOOL])
conv("whitespace_content_then_call", [
    user("Weather?"), assistant("  \n ", tool_calls=[call("get_weather", {"city": "Rome"})])],
    tools=[WEATHER_TOOL], options=[NO_GEN])
conv("parallel_calls", [
    user("Weather in two cities?"),
    assistant("Checking both.", reasoning_content="Two calls needed.",
              tool_calls=[call("get_weather", {"city": "Paris"}),
                          call("get_weather", {"city": "Berlin", "days": 1}),
                          call("search", {"query": "weather"}, False)]),
    tool("Paris: 20C"), tool("Berlin: 15C"), tool("search results"),
], tools=[WEATHER_TOOL, SEARCH_TOOL])
conv("agent_loop", [
    {"role": "system", "content": "You are an agent."},
    user("Find the weather and summarise."),
    assistant("", reasoning_content="First, weather.",
              tool_calls=[call("get_weather", {"city": "Paris"})]),
    tool("Paris: 20C, sunny"),
    assistant("", reasoning_content="Now search.", tool_calls=[call("search", {"query": "Paris"})]),
    tool("Paris is the capital of France."),
    assistant("Paris is sunny at 20C.", reasoning_content="Summarise."),
], tools=[WEATHER_TOOL, SEARCH_TOOL], options=[NO_GEN, GEN_ON, GEN_OFF])
conv("agent_loop_second_query", [
    user("Weather in Paris?"),
    assistant("", reasoning_content="Call it.", tool_calls=[call("get_weather", {"city": "Paris"})]),
    tool("20C"),
    assistant("20C.", reasoning_content="Answer."),
    user("And in Rome?"),
    assistant("", reasoning_content="Call again.", tool_calls=[call("get_weather", {"city": "Rome"})]),
    tool("25C"),
], tools=[WEATHER_TOOL])
conv("user_wrapped_tool_response", [
    user("Question?"),
    assistant("", reasoning_content="call", tool_calls=[call("ping", {})]),
    user("<tool_response>\npong\n</tool_response>"),
    assistant("Done.", reasoning_content="got pong"),
], options=[NO_GEN, GEN_ON])
conv("tool_content_parts", [user("x"), assistant("", tool_calls=[call("ping", {})]),
                            {"role": "tool", "content": [{"type": "text", "text": "  part A "},
                                                         {"type": "text", "text": "part B  "}]}])
conv("tool_content_whitespace", [user("x"), assistant("", tool_calls=[call("ping", {})]),
                                 tool("\n\n  result with spaces  \n\n")])
conv("tool_first_message", [tool("orphan result"), user("Hi")])
conv("argument_names_unicode", [user("x"), assistant("", tool_calls=[call("f", {
    "naïve key": "välue", "中文": ["列表"], "emoji😀": {"k": "v"}})])], options=[NO_GEN])
conv("tool_call_then_text_history", [
    user("A?"), assistant("Text before.", reasoning_content="r1",
                          tool_calls=[call("get_weather", {"city": "Oslo"})]),
    tool("cold"), assistant("Cold.", reasoning_content="r2"), user("B?"),
], tools=[WEATHER_TOOL])
conv("inline_think_with_call", [
    user("Q"), assistant("<think>\nplan\n</think>\n\nCalling.",
                         tool_calls=[call("get_weather", {"city": "Lima"})]),
    tool("warm"),
], tools=[WEATHER_TOOL])

conv("tools_history_preserved", [
    {"role": "system", "content": [{"type": "text", "text": "System as parts, with tools."}]},
    user("Q1"), assistant("A1", reasoning_content="R1"),
    user("Q2"), assistant("", reasoning_content="R2", tool_calls=[call("search", '{"query": "q2"}')]),
    tool("found"), assistant("A2", reasoning_content="R3"),
], tools=[SEARCH_TOOL], options=[NO_GEN, GEN_ON])
conv("empty_string_arguments", [user("x"), assistant("", tool_calls=[call("ping", "")]), tool("pong")])
conv("assistant_content_parts", [user("x"), {"role": "assistant", "content": [
    {"type": "text", "text": "<think>\npart reasoning\n</think>\n\n"}, {"type": "text", "text": "part answer"}]}],
     options=[NO_GEN, GEN_ON])
conv("long_history", [user(f"Question {i}") if i % 2 == 0 else
                      assistant(f"Answer {i}", reasoning_content=f"Reasoning {i}") for i in range(9)])
conv("thinking_off_history", [user("Q1"), assistant("<think>\n\n</think>\n\nA1"), user("Q2")],
     options=[GEN_OFF])

# --- Inputs the template refuses ---------------------------------------------------------------
conv("error_empty_messages", [], options=[GEN_ON])
conv("error_unknown_role", [user("Hi"), {"role": "developer", "content": "x"}], options=[GEN_ON])
conv("error_system_not_first", [user("Hi"), {"role": "system", "content": "late"}],
     options=[GEN_ON])
conv("error_system_only", [{"role": "system", "content": "sys"}], options=[GEN_ON])
conv("error_assistant_only", [assistant("A")], options=[NO_GEN])
conv("error_only_tool_responses", [user("<tool_response>\nx\n</tool_response>")], options=[GEN_ON])
conv("error_unknown_part_type", [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}],
     options=[GEN_ON])
conv("error_content_number", [{"role": "user", "content": 42}], options=[GEN_ON])
conv("error_content_mapping", [{"role": "user", "content": {"text": "hi"}}], options=[GEN_ON])
conv("error_tool_call_no_name", [user("x"), assistant("", tool_calls=[{"function": {
    "arguments": {}}}])], options=[NO_GEN])
conv("error_missing_role", [user("x"), {"content": "no role"}], options=[GEN_ON])
