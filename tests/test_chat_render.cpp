// Chat rendering against transformers' rendering of the official template (tests/fixtures/chat/
// renders.json, made by tools/chat/make_render_fixtures.py), the 3.6/3.8 differences as SPEC.md
// states them, the errors, and the Python text forms the template depends on.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "chat/render.h"
#include "core/error.h"

namespace qwenrt::chat {
namespace {

Json load_fixture() {
  std::ifstream file(QWENRT_SOURCE_DIR "/tests/fixtures/chat/renders.json", std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return Json::parse(text.str());
}

// Where two renders first differ, with some context, for a readable failure.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + "\n  got:  " + Json(got.substr(from, 100)).dump() +
         "\n  want: " + Json(want.substr(from, 100)).dump();
}

TEST(ChatRender, MatchesTransformersOnFixtures) {
  const Json fixture = load_fixture();
  std::map<std::string, const Json*> conversations;
  for (const Json& conversation : fixture["conversations"]) {
    conversations[conversation["name"].get<std::string>()] = &conversation;
  }
  size_t rendered = 0, refused = 0;
  std::map<std::string, int> official_conversations;  // qwen3.5 conversations that render
  for (const Json& test_case : fixture["cases"]) {
    const Json& conversation = *conversations.at(test_case["conversation"].get<std::string>());
    const std::string dialect_text = test_case["dialect"].get<std::string>();
    const auto dialect = dialect_from_name(dialect_text);
    ASSERT_TRUE(dialect) << dialect_text;
    const RenderOptions options = render_options_from_json(test_case["options"]);
    const std::string label = dialect_text + " " + conversation["name"].get<std::string>() + " " +
                              test_case["options"].dump();
    if (test_case.contains("error")) {
      EXPECT_THROW(render_chat(*dialect, conversation["messages"], conversation["tools"], options),
                   Error)
          << label << " (transformers: " << test_case["error"].get<std::string>() << ")";
      ++refused;
      continue;
    }
    const std::string want = test_case["expected"].get<std::string>();
    std::string got;
    try {
      got = render_chat(*dialect, conversation["messages"], conversation["tools"], options);
    } catch (const Error& error) {
      ADD_FAILURE() << label << ": threw " << error.what();
      continue;
    }
    EXPECT_EQ(got, want) << label << " differs " << first_difference(got, want);
    ++rendered;
    if (*dialect == Dialect::kQwen35) ++official_conversations[conversation["name"]];
  }
  EXPECT_GE(official_conversations.size(), 50u);
  EXPECT_GE(rendered, 350u);
  EXPECT_GE(refused, 30u);
}

Json user(const std::string& text) {
  return {{"role", "user"}, {"content", text}};
}
Json system(const std::string& text) {
  return {{"role", "system"}, {"content", text}};
}
Json assistant(const std::string& text, const std::string& reasoning) {
  return {{"role", "assistant"}, {"content", text}, {"reasoning_content", reasoning}};
}

// A past exchange, then a new question: the first assistant turn is before the last query.
Json two_turns() {
  return Json::array({user("Q1"), assistant("A1", "R1"), user("Q2"), assistant("A2", "R2")});
}

std::string render(Dialect dialect, const Json& messages, RenderOptions options = {}) {
  return render_chat(dialect, messages, Json(), options);
}

constexpr const char* kXhigh =
    "Reasoning effort is set to xhigh. Please think carefully through the task, validate key "
    "assumptions, consider plausible alternatives, and prioritize correctness, consistency, and "
    "clarity in the final answer.";

TEST(ChatRender, Qwen35DropsReasoningBeforeLastQuery) {
  EXPECT_EQ(render(Dialect::kQwen35, two_turns(), {.add_generation_prompt = false}),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nR2\n</think>\n\n"
            "A2<|im_end|>\n");
  // The 3.5 template has no preserve_thinking; setting it changes nothing.
  EXPECT_EQ(render(Dialect::kQwen35, two_turns(), {.preserve_thinking = true}),
            render(Dialect::kQwen35, two_turns()));
}

TEST(ChatRender, Qwen36PreserveThinkingDefaultsFalse) {
  // SPEC.md: 3.6 differs from 3.5 only by preserve_thinking, default false.
  EXPECT_EQ(render(Dialect::kQwen36, two_turns()), render(Dialect::kQwen35, two_turns()));
  EXPECT_EQ(render(Dialect::kQwen36, two_turns(), {.preserve_thinking = false}),
            render(Dialect::kQwen35, two_turns()));
  const std::string kept = render(Dialect::kQwen36, two_turns(), {.preserve_thinking = true});
  EXPECT_NE(kept.find("<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>"),
            std::string::npos)
      << kept;
  EXPECT_NE(kept.find("<think>\nR2\n</think>\n\nA2"), std::string::npos);
}

TEST(ChatRender, Qwen38PreserveThinkingDefaultsTrue) {
  const std::string kept = render(Dialect::kQwen38, two_turns());
  EXPECT_NE(kept.find("<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>"),
            std::string::npos)
      << kept;
  const std::string dropped = render(Dialect::kQwen38, two_turns(), {.preserve_thinking = false});
  EXPECT_NE(dropped.find("<|im_start|>assistant\nA1<|im_end|>"), std::string::npos) << dropped;
  EXPECT_NE(dropped.find("<think>\nR2\n</think>\n\nA2"), std::string::npos);
}

TEST(ChatRender, Qwen38ReasoningEffortPreamble) {
  const Json messages = Json::array({system("Be brief."), user("Hi")});
  const std::string tail = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
  EXPECT_EQ(render(Dialect::kQwen38, messages),
            std::string("<|im_start|>system\n") + kXhigh + "\n\nBe brief.<|im_end|>\n" + tail);
  EXPECT_EQ(render(Dialect::kQwen38, messages, {.reasoning_effort = "xhigh"}),
            render(Dialect::kQwen38, messages));
  EXPECT_EQ(render(Dialect::kQwen38, messages, {.reasoning_effort = "medium"}),
            "<|im_start|>system\nBe brief.<|im_end|>\n" + tail);
  EXPECT_EQ(render(Dialect::kQwen38, messages, {.reasoning_effort = "low"}),
            "<|im_start|>system\nReasoning effort is set to low. Keep your thinking brief and "
            "focused, moving directly to the conclusion without unnecessary elaboration.\n\n"
            "Be brief.<|im_end|>\n" +
                tail);
  // Without a system message the instruction is a system turn of its own.
  EXPECT_EQ(render(Dialect::kQwen38, Json::array({user("Hi")})),
            std::string("<|im_start|>system\n") + kXhigh + "<|im_end|>\n" + tail);
  // Thinking off: no instruction, and the empty closed think block.
  EXPECT_EQ(render(Dialect::kQwen38, messages, {.enable_thinking = false}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // The instruction opens the tools turn too.
  const Json tools = Json::array({{{"name", "f"}}});
  const std::string with_tools = render_chat(Dialect::kQwen38, messages, tools, {});
  EXPECT_EQ(with_tools.rfind(std::string("<|im_start|>system\n") + kXhigh + "\n\n# Tools\n", 0), 0u)
      << with_tools;
  // 3.5 and 3.6 never write it.
  EXPECT_EQ(
      render(Dialect::kQwen36, messages, {.reasoning_effort = "low"}).find("Reasoning effort"),
      std::string::npos);
}

TEST(ChatRender, Qwen38UnknownReasoningEffortIsAnError) {
  for (const char* effort : {"high", "max", "none", ""}) {
    try {
      render(Dialect::kQwen38, Json::array({user("Hi")}), {.reasoning_effort = effort});
      ADD_FAILURE() << effort;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("reasoning_effort"), std::string::npos);
    }
  }
}

TEST(ChatRender, EmptySystemMessage) {
  const Json messages = Json::array({system(" \n "), user("Hi")});
  // 3.5/3.6 write an empty system turn; 3.8 writes none (medium: no instruction either).
  EXPECT_EQ(render(Dialect::kQwen35, messages, {.add_generation_prompt = false}),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(render(Dialect::kQwen36, messages, {.add_generation_prompt = false}),
            render(Dialect::kQwen35, messages, {.add_generation_prompt = false}));
  EXPECT_EQ(render(Dialect::kQwen38, messages,
                   {.add_generation_prompt = false, .reasoning_effort = "medium"}),
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatRender, Qwen38KeepsThinkTagsInContent) {
  const Json messages = Json::array(
      {user("Q"), {{"role", "assistant"}, {"content", "<think>literal</think>Visible"}}});
  EXPECT_EQ(render(Dialect::kQwen38, messages,
                   {.add_generation_prompt = false, .reasoning_effort = "medium"}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "<think>literal</think>Visible<|im_end|>\n");
  EXPECT_EQ(render(Dialect::kQwen35, messages, {.add_generation_prompt = false}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nliteral\n</think>\n\n"
            "Visible<|im_end|>\n");
}

TEST(ChatRender, ToolArgumentsAsObjectOrJsonString) {
  const Json as_object = Json::parse(R"([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
       {"name": "f", "arguments": {"b": 1, "a": true, "c": [1.0, null]}}}]}])");
  Json as_string = as_object;
  as_string[1]["tool_calls"][0]["function"]["arguments"] =
      R"({"b": 1, "a": true, "c": [1.0, null]})";
  const RenderOptions options{.add_generation_prompt = false};
  const std::string want =
      "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
      "<tool_call>\n<function=f>\n<parameter=b>\n1\n</parameter>\n<parameter=a>\nTrue\n"
      "</parameter>\n<parameter=c>\n[1.0, null]\n</parameter>\n</function>\n</tool_call>"
      "<|im_end|>\n";
  EXPECT_EQ(render(Dialect::kQwen35, as_object, options), want);
  EXPECT_EQ(render(Dialect::kQwen35, as_string, options), want);
  // 3.8 writes non-string values as JSON.
  EXPECT_NE(render(Dialect::kQwen38, as_object, options).find("<parameter=a>\ntrue\n</parameter>"),
            std::string::npos);
}

// The error names the message and the problem.
void expect_error(const Json& messages, const std::string& fragment, const Json& tools = Json()) {
  try {
    render_chat(Dialect::kQwen35, messages, tools, {});
    ADD_FAILURE() << "no error for " << messages.dump();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "'" << error.what() << "' does not say '" << fragment << "'";
  }
}

TEST(ChatRender, ErrorsNameMessageAndProblem) {
  expect_error(Json::array(), "no messages");
  expect_error(Json::object(), "messages must be a list");
  expect_error(Json::array({user("x"), {{"role", "developer"}, {"content", "y"}}}),
               "message 1: unknown role 'developer'");
  expect_error(Json::array({user("x"), {{"content", "y"}}}), "message 1 has no role");
  expect_error(Json::array({user("x"), 5}), "message 1 must be an object");
  expect_error(Json::array({user("x"), system("late")}),
               "message 1: a system message must be the first");
  expect_error(Json::array({system("only")}), "no user query");
  expect_error(
      Json::array({{{"role", "user"},
                    {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "audio"}}}}}}),
      "message 0 (user): content part 1 has unknown type audio");
  expect_error(Json::array({{{"role", "user"},
                             {"content", {{{"type", "image_url"}, {"image_url", "http://x"}}}}}}),
               "message 0 (user): content part 0 is an image or video");
  expect_error(Json::array({{{"role", "user"}, {"content", 42}}}),
               "message 0 (user): content must be a string");
  expect_error(Json::array({user("x"),
                            {{"role", "assistant"},
                             {"tool_calls", {{{"function", {{"arguments", "{}"}}}}}}}}),
               "message 1 (assistant): tool call 0 has no function name");
  expect_error(Json::array({user("x"),
                            {{"role", "assistant"},
                             {"tool_calls", {{{"name", "f"}, {"arguments", "[1]"}}}}}}),
               "message 1 (assistant): tool call 0 (f): arguments must be a JSON object");
  expect_error(Json::array({user("x"),
                            {{"role", "assistant"},
                             {"tool_calls", {{{"name", "f"}, {"arguments", "{oops"}}}}}}),
               "tool call 0 (f): arguments must be a JSON object");
  expect_error(Json::array({user("x"), {{"role", "assistant"}, {"tool_calls", "f()"}}}),
               "message 1 (assistant): tool_calls must be a list");
  expect_error(Json::array({user("x"), {{"role", "assistant"}, {"reasoning_content", 3}}}),
               "message 1 (assistant): reasoning_content must be a string");
  expect_error(Json::array({user("x")}), "tools must be a list", Json::object());
}

TEST(ChatRender, OptionsFromJson) {
  const RenderOptions options = render_options_from_json(Json::parse(
      R"({"add_generation_prompt": false, "enable_thinking": false, "preserve_thinking": true,
          "reasoning_effort": "low", "unrelated": 1})"));
  EXPECT_FALSE(options.add_generation_prompt);
  EXPECT_FALSE(options.enable_thinking);
  EXPECT_EQ(options.preserve_thinking, std::optional<bool>(true));
  EXPECT_EQ(options.reasoning_effort, std::optional<std::string>("low"));
  const RenderOptions defaults = render_options_from_json(Json::object());
  EXPECT_TRUE(defaults.add_generation_prompt);
  EXPECT_TRUE(defaults.enable_thinking);
  EXPECT_FALSE(defaults.preserve_thinking);
  EXPECT_THROW(render_options_from_json(Json::parse(R"({"enable_thinking": "no"})")), Error);
  EXPECT_THROW(render_options_from_json(Json::parse(R"({"reasoning_effort": 2})")), Error);
}

TEST(ChatRender, DialectNamesAndCheckpoints) {
  for (const Dialect dialect : {Dialect::kQwen35, Dialect::kQwen36, Dialect::kQwen38}) {
    EXPECT_EQ(dialect_from_name(dialect_name(dialect)), std::optional<Dialect>(dialect));
  }
  EXPECT_FALSE(dialect_from_name("3.6"));
  EXPECT_EQ(dialect_for(model::Checkpoint::kQwen36_27B), Dialect::kQwen36);
  EXPECT_EQ(dialect_for(model::Checkpoint::kQwen36_35B_A3B), Dialect::kQwen36);
  EXPECT_EQ(dialect_for(model::Checkpoint::kQwen38_27B), Dialect::kQwen38);
  EXPECT_EQ(dialect_for(model::Checkpoint::kQwen38_FlashNext), Dialect::kQwen38);
  EXPECT_EQ(dialect_for(model::Checkpoint::kOther), Dialect::kQwen35);
}

TEST(PyText, FloatRepr) {
  const std::pair<double, const char*> cases[] = {{1.0, "1.0"},
                                                  {0.1, "0.1"},
                                                  {2.5, "2.5"},
                                                  {100.0, "100.0"},
                                                  {1e15, "1000000000000000.0"},
                                                  {1e16, "1e+16"},
                                                  {1e22, "1e+22"},
                                                  {1.5e300, "1.5e+300"},
                                                  {1e-4, "0.0001"},
                                                  {1e-5, "1e-05"},
                                                  {1.25e-7, "1.25e-07"},
                                                  {5e-324, "5e-324"},
                                                  {-0.0, "-0.0"},
                                                  {0.0, "0.0"},
                                                  {-2.75, "-2.75"},
                                                  {123456789012345678.0, "1.2345678901234568e+17"},
                                                  {12345.678, "12345.678"},
                                                  {0.30000000000000004, "0.30000000000000004"}};
  for (const auto& [value, want] : cases) EXPECT_EQ(py_float_repr(value), want) << want;
  EXPECT_EQ(py_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(py_float_repr(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(py_float_repr(std::nan("")), "nan");
}

TEST(PyText, JsonDumps) {
  const Json value = Json::parse(
      R"({"z": 1, "a": [true, false, null, 1.0, -3, 1e16], "s": "q\"b\\n\n\t\r\b\f\u0001\u007f é 😀 \u2028", "e": {}, "l": []})");
  EXPECT_EQ(py_json_dumps(value),
            "{\"z\": 1, \"a\": [true, false, null, 1.0, -3, 1e+16], \"s\": \"q\\\"b\\\\n\\n\\t\\r"
            "\\b\\f\\u0001\x7f é 😀 \u2028\", \"e\": {}, \"l\": []}");
  EXPECT_EQ(py_json_dumps(Json(18446744073709551615ull)), "18446744073709551615");
}

TEST(PyText, Str) {
  EXPECT_EQ(py_str(Json(true)), "True");
  EXPECT_EQ(py_str(Json(false)), "False");
  EXPECT_EQ(py_str(Json()), "None");
  EXPECT_EQ(py_str(Json(-7)), "-7");
  EXPECT_EQ(py_str(Json(7.0)), "7.0");
  EXPECT_EQ(py_str(Json("text")), "text");
  EXPECT_THROW(py_str(Json::array()), Error);
}

TEST(PyText, Strip) {
  EXPECT_EQ(py_strip(" \t\n x y \r\v\f"), "x y");
  EXPECT_EQ(py_strip("\u3000\u00a0\u2028\u0085\x1c x \u200a\u202f\u205f\u1680"), "x");
  EXPECT_EQ(py_strip("\u200b x \u200b"), "\u200b x \u200b");  // zero-width space is not space
  EXPECT_EQ(py_strip("   "), "");
  EXPECT_EQ(py_strip(""), "");
  EXPECT_EQ(py_strip("\xff x \xe3\x80"), "\xff x \xe3\x80");  // broken UTF-8 is not space
  EXPECT_EQ(py_strip("é"), "é");
}

}  // namespace
}  // namespace qwenrt::chat
