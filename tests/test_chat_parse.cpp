// Reply parsing: the lenient cases one by one, schema coercion, streaming events, and a property
// test (thousands of generated replies, canonical and lenient, whole and cut short, fed in random
// chunks, must give the whole-text result and, where the reply is well-formed, what was generated).
// Values holding tool-call markup and streamed arguments: test_chat_parse_markup.cpp.
#include <gtest/gtest.h>

#include <random>

#include "chat/parse.h"
#include "chat/render.h"
#include "support/reply_parse.h"

namespace qwenrt::chat {
namespace {

// tests/support/reply_parse.h
using testing_support::call;
using testing_support::dump_arguments;
using testing_support::kTools;
using testing_support::parse;
using testing_support::valid_utf8;

TEST(ChatParse, ReasoningThenContent) {
  EXPECT_REPLY(parse("Let me think.\nStep 2.\n</think>\n\nHello!"),
               (ParsedReply{.reasoning = "Let me think.\nStep 2.", .content = "Hello!"}));
  EXPECT_REPLY(parse("Hello!", /*thinking=*/false), (ParsedReply{.content = "Hello!"}));
  // Thinking on but the think block never closed: all of it is reasoning.
  EXPECT_REPLY(parse("still thinking"), (ParsedReply{.reasoning = "still thinking"}));
}

TEST(ChatParse, WhitespaceOnlyReasoningIsDropped) {
  EXPECT_REPLY(parse("\n\n</think>\n\nAnswer"), (ParsedReply{.content = "Answer"}));
  EXPECT_REPLY(parse(" \t\n</think>"), ParsedReply{});
}

TEST(ChatParse, StrayThinkTags) {
  // A repeated opener inside the think block and a closer in content are not text.
  EXPECT_REPLY(parse("<think>\nR\n</think>\n\nA</think>B"),
               (ParsedReply{.reasoning = "R", .content = "AB"}));
  // Thinking was off, yet the model opened a think block first thing.
  EXPECT_REPLY(parse("\n<think>\nR\n</think>\n\nA", false),
               (ParsedReply{.reasoning = "R", .content = "A"}));
  // Later in content, <think> is just text.
  EXPECT_REPLY(parse("A <think> B", false), (ParsedReply{.content = "A <think> B"}));
}

const char* kWeatherCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

TEST(ChatParse, CanonicalToolCall) {
  const ParsedReply want{.reasoning = "Need weather.",
                         .content = "Let me check.",
                         .tool_calls = {call("get_weather", {{"city", "Paris"}, {"days", "3"}})}};
  EXPECT_REPLY(parse(std::string("Need weather.\n</think>\n\nLet me check.\n\n") + kWeatherCall),
               want);
}

TEST(ChatParse, TextBeforeToolCallWithoutBreak) {
  EXPECT_REPLY(
      parse(std::string("Checking now.") + kWeatherCall, false),
      (ParsedReply{.content = "Checking now.",
                   .tool_calls = {call("get_weather", {{"city", "Paris"}, {"days", "3"}})}}));
}

TEST(ChatParse, MissingToolCallOpen) {
  EXPECT_REPLY(
      parse("R\n</think>\n\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
            "</function>\n</tool_call>"),
      (ParsedReply{.reasoning = "R", .tool_calls = {call("get_weather", {{"city", "Oslo"}})}}));
  EXPECT_REPLY(parse("Sure.\n<function=ping>\n</function>", false),
               (ParsedReply{.content = "Sure.", .tool_calls = {call("ping", Json::object())}}));
}

TEST(ChatParse, MissingThinkCloseBeforeToolCall) {
  EXPECT_REPLY(
      parse(std::string("I should look it up.\n\n") + kWeatherCall),
      (ParsedReply{.reasoning = "I should look it up.",
                   .tool_calls = {call("get_weather", {{"city", "Paris"}, {"days", "3"}})}}));
}

TEST(ChatParse, ToolCallInsideThinkBlock) {
  EXPECT_REPLY(
      parse(std::string("Plan A.\n") + kWeatherCall + "\nPlan B.\n</think>\n\nDone."),
      (ParsedReply{.reasoning = "Plan A.\nPlan B.",
                   .content = "Done.",
                   .tool_calls = {call("get_weather", {{"city", "Paris"}, {"days", "3"}})}}));
}

TEST(ChatParse, DuplicatedAndMissingClosers) {
  // A duplicated </parameter>.
  EXPECT_REPLY(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</parameter>\n"
                     "<parameter=b>\n2\n</parameter></parameter>\n</function>\n</tool_call>",
                     false),
               (ParsedReply{.tool_calls = {call("f", {{"a", "1"}, {"b", "2"}})}}));
  // Missing </parameter>: the next tag ends the value.
  EXPECT_REPLY(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\ntwo\n"
                     "</function>\n</tool_call>",
                     false),
               (ParsedReply{.tool_calls = {call("f", {{"a", "1"}, {"b", "two"}})}}));
  // Missing </function>, and missing </tool_call>.
  EXPECT_REPLY(
      parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", false),
      (ParsedReply{.tool_calls = {call("f", {{"a", "1"}})}}));
  EXPECT_REPLY(
      parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>", false),
      (ParsedReply{.tool_calls = {call("f", {{"a", "1"}})}}));
}

TEST(ChatParse, SeveralCallsInARow) {
  const std::string one = "<tool_call>\n<function=a>\n</function>\n</tool_call>";
  const std::string two =
      "<tool_call>\n<function=b>\n<parameter=x>\n1\n</parameter>\n</function>\n"
      "</tool_call>";
  const ParsedReply want{.tool_calls = {call("a", Json::object()), call("b", {{"x", "1"}})}};
  EXPECT_REPLY(parse(one + "\n" + two, false), want);
  EXPECT_REPLY(parse(one + two, false), want);
  // Without </tool_call> between them, and without <tool_call> before the second.
  EXPECT_REPLY(parse("<tool_call>\n<function=a>\n</function>\n<tool_call>\n<function=b>\n"
                     "<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
                     false),
               want);
  EXPECT_REPLY(parse("<tool_call>\n<function=a>\n</function>\n</tool_call>\n<function=b>\n"
                     "<parameter=x>\n1\n</parameter>\n</function>",
                     false),
               want);
}

TEST(ChatParse, CutOffCallIsIncompleteNotDropped) {
  EXPECT_REPLY(
      parse("Looking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", false),
      (ParsedReply{.content = "Looking.",
                   .tool_calls = {call("get_weather", {{"city", "Par"}}, false)}}));
  EXPECT_REPLY(parse("<tool_call>\n<function=get_wea", false),
               (ParsedReply{.tool_calls = {call("get_wea", Json::object(), false)}}));
  EXPECT_REPLY(parse("<tool_call>\n", false),
               (ParsedReply{.tool_calls = {call("", Json::object(), false)}}));
  EXPECT_REPLY(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<param", false),
               (ParsedReply{.tool_calls = {call("f", {{"a", "1"}}, false)}}));
  // </function> was written: only the closing tag is missing, the call is whole.
  EXPECT_REPLY(parse("<tool_call>\n<function=f>\n</function>\n</tool_", false),
               (ParsedReply{.tool_calls = {call("f", Json::object())}}));
  // An earlier whole call stays whole.
  EXPECT_REPLY(
      parse("<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n"
            "<parameter=x>\n",
            false),
      (ParsedReply{.tool_calls = {call("a", Json::object()), call("b", {{"x", ""}}, false)}}));
}

TEST(ChatParse, ValuesKeepTheirText) {
  // Only the format's own newline on each side is removed; '<' and '>' in values are text.
  EXPECT_REPLY(parse("<tool_call>\n<function=w>\n<parameter=code>\n\nif (a < b && c > d) {\n  "
                     "return \"<div>\";\n}\n\n</parameter>\n</function>\n</tool_call>",
                     false),
               (ParsedReply{.tool_calls = {call("w", {{"code",
                                                       "\nif (a < b && c > d) {\n  return "
                                                       "\"<div>\";\n}\n"}})}}));
  // Names are trimmed.
  EXPECT_REPLY(parse("<function= f >\n<parameter= a >\nv\n</parameter>\n</function>", false),
               (ParsedReply{.tool_calls = {call("f", {{"a", "v"}})}}));
}

TEST(ChatParse, NotACallAfterAllIsText) {
  // "<tool_call>" followed by something that is not a function: the text is kept, not dropped.
  EXPECT_REPLY(parse("About <tool_call> tags: they wrap calls.", false),
               (ParsedReply{.content = "About <tool_call> tags: they wrap calls."}));
  EXPECT_REPLY(parse("Use <function=name\nlike this>.", false),
               (ParsedReply{.content = "Use <function=name\nlike this>."}));
  EXPECT_REPLY(parse("a < b, c <tool d", false), (ParsedReply{.content = "a < b, c <tool d"}));
}

Json coerced(const std::string& parameter, const std::string& value,
             const std::string& function = "f") {
  const ParsedReply reply =
      parse("<tool_call>\n<function=" + function + ">\n<parameter=" + parameter + ">\n" + value +
                "\n</parameter>\n</function>\n</tool_call>",
            false, kTools);
  return reply.tool_calls.at(0).arguments.at(parameter);
}

TEST(ChatParse, ParametersCoercedBySchema) {
  EXPECT_EQ(coerced("s", "42"), Json("42"));  // string-typed stays the raw text
  EXPECT_EQ(coerced("s", "{\"a\": 1}"), Json("{\"a\": 1}"));
  EXPECT_EQ(coerced("i", "42"), Json(42));
  EXPECT_EQ(coerced("i", "4.5"), Json("4.5"));  // not an integer: the raw text
  EXPECT_EQ(coerced("i", "forty"), Json("forty"));
  EXPECT_EQ(coerced("n", "4.5"), Json(4.5));
  EXPECT_EQ(coerced("n", " -1e3 "), Json(-1000.0));
  EXPECT_EQ(coerced("b", "true"), Json(true));
  EXPECT_EQ(coerced("b", "False"), Json(false));  // as the 3.5 template writes it
  EXPECT_EQ(coerced("b", "yes"), Json("yes"));
  EXPECT_EQ(coerced("o", "{\"z\": [1, 2], \"a\": null}"),
            Json::parse("{\"z\": [1, 2], \"a\": null}"));
  EXPECT_EQ(coerced("o", "{\"z\": "), Json("{\"z\": "));  // invalid JSON: the raw text
  EXPECT_EQ(coerced("o", "[1]"), Json("[1]"));            // wrong type: the raw text
  EXPECT_EQ(coerced("a", "[1, \"x\"]"), Json::parse("[1, \"x\"]"));
  EXPECT_EQ(coerced("opt", "null"), Json());
  EXPECT_EQ(coerced("opt", "None"), Json());
  EXPECT_EQ(coerced("opt", "7"), Json(7));
  EXPECT_EQ(coerced("any", "7.5"), Json(7.5));
  EXPECT_EQ(coerced("any", "seven"), Json("seven"));
  EXPECT_EQ(coerced("e", "1"), Json("1"));  // no type: the raw text
  EXPECT_EQ(coerced("unknown", "1"), Json("1"));
  EXPECT_EQ(coerced("k", "1", "bare"), Json(1));     // a tool given as the bare function
  EXPECT_EQ(coerced("k", "1", "other"), Json("1"));  // a function the request did not offer
  // Object keys keep the model's order.
  EXPECT_EQ(coerced("o", "{\"z\": 1, \"a\": 2}").dump(), "{\"z\":1,\"a\":2}");
}

TEST(ChatParse, RenderedCallsParseBack) {
  // What the renderer writes for a call, the parser reads back (3.8 writes values as JSON, so with
  // the schema the types come back too).
  const Json arguments = Json::parse(
      R"({"s": "multi\nline <b>", "i": -3, "n": 2.5, "b": true, "o": {"k": [1, {"x": null}]},
          "a": ["p", 1.5], "opt": null})");
  const Json messages =
      Json::array({{{"role", "user"}, {"content", "x"}},
                   {{"role", "assistant"},
                    {"content", "Calling."},
                    {"reasoning_content", "Think."},
                    {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", arguments}}}}}}}});
  const std::string prompt =
      render_chat(Dialect::kQwen38, messages, kTools,
                  {.add_generation_prompt = false, .reasoning_effort = "medium"});
  const std::string opener = "<|im_start|>assistant\n<think>\n";
  const size_t begin = prompt.find(opener) + opener.size();
  const std::string reply = prompt.substr(begin, prompt.rfind("<|im_end|>") - begin);
  EXPECT_REPLY(parse(reply, true, kTools), (ParsedReply{.reasoning = "Think.",
                                                        .content = "Calling.",
                                                        .tool_calls = {call("f", arguments)}}));
}

TEST(ChatParse, StreamingEvents) {
  ReplyParser parser({.starts_in_reasoning = true});
  std::vector<ReplyEvent> events;
  const std::string text = std::string("Hmm.\n</think>\n\nOK.\n") + kWeatherCall;
  for (const char c : text) {
    for (auto& event : parser.feed(std::string_view(&c, 1))) events.push_back(std::move(event));
  }
  for (auto& event : parser.finish()) events.push_back(std::move(event));
  std::string reasoning, content;
  std::vector<std::string> order;
  for (const ReplyEvent& event : events) {
    switch (event.kind) {
      case ReplyEvent::Kind::kReasoning:
        reasoning += event.text;
        break;
      case ReplyEvent::Kind::kContent:
        content += event.text;
        break;
      case ReplyEvent::Kind::kToolCallBegin:
        order.push_back("begin " + event.call.name);
        break;
      case ReplyEvent::Kind::kToolCall:
        order.push_back("call " + event.call.name);
        EXPECT_EQ(event.call, parser.result().tool_calls.at(event.tool_index));
        break;
      case ReplyEvent::Kind::kToolCallArgs:
        break;
    }
  }
  EXPECT_EQ(reasoning, "Hmm.");
  EXPECT_EQ(content, "OK.");
  EXPECT_EQ(order, (std::vector<std::string>{"begin get_weather", "call get_weather"}));
  // The begin event comes as soon as the name is read, before the parameters.
  ReplyParser early({.starts_in_reasoning = false});
  const auto first = early.feed("<tool_call>\n<function=get_weather>\n<parameter=ci");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].kind, ReplyEvent::Kind::kToolCallBegin);
  EXPECT_EQ(first[0].call.name, "get_weather");
}

// --- Property test ---------------------------------------------------------------------------

// Words for generated text: Unicode, and fragments of tags (never a whole tag: tags hold no space).
const std::vector<std::string> kWords = {
    "the",        "weather",   "is",     "fine",       "héllo", "世界",    "😀",       "naïve",
    "a<b",        "x > y",     "<div>",  "<",          "</",    "<tool",   "</think", "<function",
    "<parameter", "=",         ">",      "\"quoted\"", "{",     "}",       "[1,",     "2]",
    "call",       "tool_call", "</tool", "<t",         "ok.",   "Ünïcode", "١٢٣"};

struct Generated {
  std::string text;
  bool starts_in_reasoning = true;
  bool exact = true;  // `expected` is what parsing must give (false for cut-short text)
  ParsedReply expected;
  size_t cut_inside_call = SIZE_MAX;  // for cut text: the index of the call the cut falls inside
  Json tools;
};

// a + b, spelled so that GCC 12 does not warn falsely (-Wrestrict at -O3) as it does on
// "literal" + std::string.
std::string concat(std::string_view a, std::string_view b) {
  std::string joined;
  joined.reserve(a.size() + b.size());
  joined.append(a).append(b);
  return joined;
}

class ReplyGenerator {
 public:
  explicit ReplyGenerator(uint32_t seed) : rng_(seed) {}

  Generated next() {
    Generated g;
    g.starts_in_reasoning = coin(0.7);
    const std::string reasoning = g.starts_in_reasoning && coin(0.8) ? sentence() : "";
    const std::string content = coin(0.7) ? sentence() : "";
    std::vector<ToolCall> calls;
    const int n_calls = coin(0.5) ? pick(1, 3) : 0;
    for (int i = 0; i < n_calls; ++i) calls.push_back(random_call());
    g.expected.content = content;
    g.expected.tool_calls = calls;

    // Lenient shapes that still have one right reading.
    const bool no_think_close =
        g.starts_in_reasoning && n_calls > 0 && content.empty() && coin(0.2);
    const bool call_in_think = g.starts_in_reasoning && n_calls > 0 && !no_think_close && coin(0.2);
    std::string& out = g.text;
    std::vector<std::pair<size_t, size_t>> call_spans;  // [after <tool_call>, at </function>)
    if (g.starts_in_reasoning) {
      out += pad() + reasoning;
      g.expected.reasoning = reasoning;
      if (call_in_think) {
        const std::string more = sentence();
        out += "\n";
        append_call(out, calls[0], call_spans);
        out += pad() + more;
        g.expected.reasoning = reasoning.empty() ? more : reasoning + "\n" + more;
        // The call came first: the rest follow the think block.
      }
      if (!no_think_close) out += pad() + "</think>" + pad();
    }
    out += content;
    for (size_t i = call_in_think ? 1 : 0; i < calls.size(); ++i) {
      out +=
          (i == 0 && !content.empty()) ? pick_of({"\n\n", "", " "}) : pick_of({"\n", "", "\n\n"});
      append_call(out, calls[i], call_spans);
    }
    if (coin(0.3)) out += pad();

    if (coin(0.25)) {
      // Cut short, as by a token limit.
      const size_t cut = std::uniform_int_distribution<size_t>(0, out.size())(rng_);
      out.resize(cut);
      g.exact = false;
      for (size_t i = 0; i < call_spans.size(); ++i) {
        if (cut >= call_spans[i].first && cut < call_spans[i].second) g.cut_inside_call = i;
      }
    }
    return g;
  }

 private:
  bool coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::string pick_of(std::initializer_list<const char*> options) {
    return *(options.begin() + pick(0, static_cast<int>(options.size()) - 1));
  }
  std::string pad() { return pick_of({"", "\n", "\n\n", " ", " \n\t"}); }

  std::string sentence() {
    std::string text;
    const int n = pick(1, 12);
    for (int i = 0; i < n; ++i) {
      if (i > 0) text += pick_of({" ", " ", " ", "\n", "  ", "\n\n"});
      text += kWords[static_cast<size_t>(pick(0, static_cast<int>(kWords.size()) - 1))];
    }
    return text;
  }

  ToolCall random_call() {
    ToolCall c{.name = pick_of({"get_weather", "search", "f", "run_code", "名前"}),
               .complete = true};
    const int n = pick(0, 3);
    for (int i = 0; i < n; ++i) {
      std::string value = coin(0.2) ? "" : sentence();
      // Newlines and spaces of the value itself survive.
      if (coin(0.2)) value = concat("\n", value);
      if (coin(0.2)) value += "\n";
      if (coin(0.1)) value = concat("  ", value) + " ";
      c.arguments[concat("p", std::to_string(i))] = value;
    }
    return c;
  }

  void append_call(std::string& out, const ToolCall& c,
                   std::vector<std::pair<size_t, size_t>>& spans) {
    // A cut after "<tool_call>" is inside the call; without that opener (the lenient form), only
    // a cut after "<function=" is.
    const bool opener = coin(0.85);
    if (opener) out += "<tool_call>\n";
    const size_t start = out.size() + (opener ? 0 : std::string_view("<function=").size());
    out += "<function=" + c.name + ">\n";
    for (const auto& [name, value] : c.arguments.items()) {
      out += "<parameter=" + name + ">\n" + value.get<std::string>() + "\n";
      if (coin(0.9)) out += "</parameter>\n";  // else missing: the next tag ends the value
      if (coin(0.1)) out += "</parameter>\n";  // duplicated
    }
    spans.emplace_back(start, out.size());
    const bool close_function = coin(0.9);
    if (close_function) out += "</function>\n";
    if (coin(0.9) || !close_function) out += "</tool_call>";
  }

  std::mt19937 rng_;
};

ParsedReply stream(const Generated& g, std::mt19937& rng, int max_chunk) {
  ReplyParser parser({.starts_in_reasoning = g.starts_in_reasoning, .tools = g.tools});
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  std::vector<std::string> begun;
  std::string args;  // the open call's argument fragments
  // Deltas never split a UTF-8 sequence (a cut-short text may end inside one; that is its own).
  const bool input_valid = valid_utf8(g.text);
  const auto take = [&](std::vector<ReplyEvent> events) {
    for (ReplyEvent& event : events) {
      switch (event.kind) {
        case ReplyEvent::Kind::kReasoning:
          EXPECT_TRUE(!input_valid || valid_utf8(event.text));
          reasoning += event.text;
          break;
        case ReplyEvent::Kind::kContent:
          EXPECT_TRUE(!input_valid || valid_utf8(event.text));
          content += event.text;
          break;
        case ReplyEvent::Kind::kToolCallBegin:
          EXPECT_EQ(event.tool_index, calls.size());
          begun.push_back(event.call.name);
          break;
        case ReplyEvent::Kind::kToolCall:
          EXPECT_EQ(event.tool_index, calls.size());
          // The call's argument fragments spell its arguments exactly.
          EXPECT_EQ(args, dump_arguments(event.call));
          args.clear();
          calls.push_back(event.call);
          break;
        case ReplyEvent::Kind::kToolCallArgs:
          EXPECT_EQ(event.tool_index, calls.size());
          args += event.text;
          break;
      }
    }
  };
  for (size_t pos = 0; pos < g.text.size();) {
    const size_t size =
        std::uniform_int_distribution<size_t>(1, static_cast<size_t>(max_chunk))(rng);
    take(parser.feed(std::string_view(g.text).substr(pos, size)));
    pos += size;
  }
  take(parser.finish());
  const ParsedReply& result = parser.result();
  EXPECT_EQ(reasoning, result.reasoning);
  EXPECT_EQ(content, result.content);
  EXPECT_EQ(calls, result.tool_calls);
  // Every call whose name was read was announced first.
  for (size_t i = 0; i < begun.size(); ++i) EXPECT_EQ(begun[i], result.tool_calls.at(i).name);
  return result;
}

TEST(ChatParse, StreamingEqualsWholeOnGeneratedReplies) {
  ReplyGenerator generator(20261129);
  std::mt19937 rng(7);
  int exact = 0, cut = 0, cut_in_call = 0;
  for (int i = 0; i < 3000; ++i) {
    const Generated g = generator.next();
    const ParsedReply whole = parse(g.text, g.starts_in_reasoning);
    SCOPED_TRACE("reply " + std::to_string(i) + ": " +
                 Json(g.text).dump(-1, ' ', false, Json::error_handler_t::replace));
    if (g.exact) {
      EXPECT_REPLY(whole, g.expected);
      ++exact;
    } else {
      ++cut;
      // Cut inside a call: the calls before it are whole and it is there, marked incomplete.
      if (g.cut_inside_call != SIZE_MAX) {
        ++cut_in_call;
        ASSERT_EQ(whole.tool_calls.size(), g.cut_inside_call + 1);
        EXPECT_FALSE(whole.tool_calls.back().complete);
        for (size_t k = 0; k < g.cut_inside_call; ++k) {
          EXPECT_EQ(whole.tool_calls[k], g.expected.tool_calls[k]);
        }
      }
    }
    for (const int max_chunk : {1, 3, 16, 200}) {
      EXPECT_REPLY(stream(g, rng, max_chunk), whole);
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(exact, 2000);
  EXPECT_GT(cut, 500);
  EXPECT_GT(cut_in_call, 100);
}

TEST(ChatParse, StreamingEqualsWholeOnArbitraryText) {
  // Tags, pieces of tags and text in any order: whatever the reading, every chunking agrees.
  const std::vector<std::string> pieces = {"<think>",
                                           "</think>",
                                           "<tool_call>",
                                           "</tool_call>",
                                           "<function=f>",
                                           "<function=",
                                           "</function>",
                                           "<parameter=p>",
                                           "<parameter=",
                                           "<tool_",
                                           "call>",
                                           "</para",
                                           "meter>",
                                           "<",
                                           ">",
                                           "=",
                                           "/",
                                           "\n",
                                           "\n\n",
                                           " ",
                                           "\t",
                                           "x",
                                           "word",
                                           "é",
                                           "😀",
                                           "中",
                                           "{\"a\": 1}",
                                           "true",
                                           "42",
                                           "<think",
                                           "</tool_call",
                                           "name>",
                                           "\n<function=g>\n"};
  std::mt19937 rng(99);
  for (int i = 0; i < 4000; ++i) {
    Generated g{.starts_in_reasoning = (i % 2) == 0, .exact = false, .tools = kTools};
    const int n = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int k = 0; k < n; ++k) {
      g.text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    }
    SCOPED_TRACE("text " + std::to_string(i) + ": " + Json(g.text).dump());
    const ParsedReply whole = parse(g.text, g.starts_in_reasoning, kTools);
    for (const int max_chunk : {1, 2, 7}) EXPECT_REPLY(stream(g, rng, max_chunk), whole);
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace qwenrt::chat
