// Reply parsing of values that hold tool-call markup (tags inside a parameter's value come back
// whole, boundaries follow the schema, a missing parameter close, a parameter given twice), and
// tool-call arguments streamed as they are generated, each checked over many chunkings.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "chat/parse.h"
#include "support/reply_parse.h"

namespace qwenrt::chat {
namespace {

// tests/support/reply_parse.h
using testing_support::call;
using testing_support::dump_arguments;
using testing_support::kTools;
using testing_support::parse;
using testing_support::valid_utf8;

// A run of the parser over one chunking: its events in a normal form (consecutive fragments of one
// kind joined) and its result; every call's argument fragments must spell arguments.dump().
struct ChunkedRun {
  std::vector<std::string> events;
  ParsedReply result;
};

ChunkedRun run_chunked(std::string_view text, const ReplyParserOptions& options,
                       const std::function<size_t()>& next_size) {
  ReplyParser parser(options);
  ChunkedRun run;
  std::string args;
  const auto take = [&](std::vector<ReplyEvent> events) {
    for (const ReplyEvent& e : events) {
      std::string line;
      switch (e.kind) {
        case ReplyEvent::Kind::kReasoning:
          line = "reasoning " + e.text;
          break;
        case ReplyEvent::Kind::kContent:
          line = "content " + e.text;
          break;
        case ReplyEvent::Kind::kToolCallBegin:
          line = "begin " + std::to_string(e.tool_index) + " " + e.call.name;
          break;
        case ReplyEvent::Kind::kToolCallArgs:
          line = "args " + std::to_string(e.tool_index) + " " + e.text;
          args += e.text;
          break;
        case ReplyEvent::Kind::kToolCall:
          line = "call " + std::to_string(e.tool_index) + " " + dump_arguments(e.call) +
                 (e.call.complete ? "" : " cut");
          EXPECT_EQ(args, dump_arguments(e.call)) << "call " << e.call.name;
          args.clear();
          break;
      }
      const size_t space = line.find(' ', line.rfind("args", 0) == 0 ? 5 : 0);
      if (e.kind != ReplyEvent::Kind::kToolCallBegin && e.kind != ReplyEvent::Kind::kToolCall &&
          !run.events.empty() && run.events.back().compare(0, space, line, 0, space) == 0) {
        run.events.back() += line.substr(space + 1);
      } else {
        run.events.push_back(std::move(line));
      }
    }
  };
  for (size_t pos = 0; pos < text.size();) {
    const size_t size = std::max<size_t>(1, next_size());
    take(parser.feed(text.substr(pos, size)));
    pos += size;
  }
  take(parser.finish());
  EXPECT_TRUE(args.empty()) << "fragments after the last call: " << args;
  run.result = parser.result();
  return run;
}

// Parses `text` whole, then in chunks of 1, 2, 3 and 7 bytes and in random splits: every run
// gives the same events and result, and the whole reading is `want`.
void expect_every_chunking(const std::string& text, const Json& tools, const ParsedReply& want) {
  SCOPED_TRACE("text: " + Json(text).dump());
  const ReplyParserOptions options{.starts_in_reasoning = false, .tools = tools};
  const ChunkedRun whole = run_chunked(text, options, [&] { return text.size(); });
  EXPECT_REPLY(whole.result, want);
  EXPECT_REPLY(parse(text, false, tools), want);
  for (const size_t size : {1, 2, 3, 7}) {
    const ChunkedRun chunked = run_chunked(text, options, [&] { return size; });
    EXPECT_EQ(chunked.events, whole.events) << "chunks of " << size;
    EXPECT_REPLY(chunked.result, whole.result);
  }
  std::mt19937 rng(static_cast<uint32_t>(text.size()));
  for (int i = 0; i < 20; ++i) {
    const ChunkedRun chunked = run_chunked(
        text, options, [&] { return std::uniform_int_distribution<size_t>(1, 12)(rng); });
    EXPECT_EQ(chunked.events, whole.events) << "random split " << i;
    EXPECT_REPLY(chunked.result, whole.result);
  }
}

const Json kWriteTool = Json::parse(R"([{"type": "function", "function": {"name": "write_file",
  "parameters": {"type": "object", "properties": {"path": {"type": "string"},
  "content": {"type": "string"}, "mode": {"type": "integer"}}}}}])");

// A write_file call as the template writes it, with `content` written verbatim.
std::string write_call(const std::string& content, const std::string& path = "a.xml") {
  return "<tool_call>\n<function=write_file>\n<parameter=path>\n" + path +
         "\n</parameter>\n<parameter=content>\n" + content +
         "\n</parameter>\n</function>\n</tool_call>";
}

TEST(ChatParseMarkup, ValuesHoldingTagsComeBackWhole) {
  const std::vector<std::string> contents = {
      // A </parameter> that is not followed by what may come next.
      "a\n</parameter>\nb",
      "x</parameter>y",
      // Other parameter tags: names the schema does not have, or not on lines of their own.
      "<parameter=other>\nv\n</parameter>\ntext",
      "see <parameter=path>x</parameter> here",
      // </function>, </tool_call> and <tool_call> inside, and a whole call written into a file.
      "end of </function> text",
      "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
      "line\n</tool_call>\n</tool_call>",
      "<calls>\n<tool_call>\n<function=g>\n</function>\n</tool_call>\n</parameter>\n</calls>\n",
      // Our own tests: C++ string literals with escaped newlines.
      R"(parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\ntwo\n</function>"))",
  };
  for (const std::string& content : contents) {
    expect_every_chunking(
        write_call(content), kWriteTool,
        ParsedReply{.tool_calls = {call("write_file", {{"path", "a.xml"}, {"content", content}})}});
  }
  // Without a schema any new name may follow a </parameter>, so only text that cannot be a
  // boundary stays in the value; what the format cannot tell apart ends it.
  for (const std::string& content :
       {std::string("a\n</parameter>\nb"), std::string("x</parameter>y"),
        std::string("end of </function> text"), std::string("line\n</tool_call>\n</tool_call>"),
        std::string(R"(s = "<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";)")}) {
    expect_every_chunking(
        write_call(content), Json(),
        ParsedReply{.tool_calls = {call("write_file", {{"path", "a.xml"}, {"content", content}})}});
  }
  // A name given already, or the value's own name, is not what comes next.
  expect_every_chunking(
      write_call("x\n</parameter>\n<parameter=path>\ny\n</parameter>\n<parameter=content>\nz"),
      Json(),
      ParsedReply{
          .tool_calls = {call("write_file", {{"path", "a.xml"},
                                             {"content",
                                              "x\n</parameter>\n<parameter=path>\ny\n</parameter>\n"
                                              "<parameter=content>\nz"}})}});
  // <tool_call> text in content and between calls' values is never a value's end.
  expect_every_chunking(
      write_call("<tool_call>\n<tool_call>"), kWriteTool,
      ParsedReply{.tool_calls = {call("write_file", {{"path", "a.xml"},
                                                     {"content", "<tool_call>\n<tool_call>"}})}});
}

TEST(ChatParseMarkup, BoundariesFollowTheSchema) {
  // A name the schema does not have: the "next parameter" is text of the value.
  const std::string bogus =
      "<tool_call>\n<function=write_file>\n<parameter=path>\np\n</parameter>\n<parameter=bogus>\n"
      "v\n</parameter>\n</function>\n</tool_call>";
  expect_every_chunking(
      bogus, kWriteTool,
      ParsedReply{
          .tool_calls = {call("write_file", {{"path", "p\n</parameter>\n<parameter=bogus>\nv"}})}});
  // Without a schema, and for a function the tools do not have, it is a parameter.
  const ParsedReply two{.tool_calls = {call("write_file", {{"path", "p"}, {"bogus", "v"}})}};
  expect_every_chunking(bogus, Json(), two);
  std::string unknown = bogus;
  unknown.replace(unknown.find("write_file"), 10, "other_tool");
  expect_every_chunking(
      unknown, kWriteTool,
      ParsedReply{.tool_calls = {call("other_tool", two.tool_calls[0].arguments)}});
  // Several parameters, one typed, in any order the schema allows.
  expect_every_chunking(
      "<tool_call>\n<function=write_file>\n<parameter=mode>\n420\n</parameter>\n"
      "<parameter=content>\n<parameter=mode>\n</parameter>x\n</parameter>\n<parameter=path>\n"
      "p\n</parameter>\n</function>\n</tool_call>",
      kWriteTool,
      ParsedReply{.tool_calls = {call("write_file", {{"mode", 420},
                                                     {"content", "<parameter=mode>\n</parameter>x"},
                                                     {"path", "p"}})}});
}

TEST(ChatParseMarkup, MissingParameterCloseStaysLenient) {
  // The model left </parameter> out: the next parameter, </function> or </tool_call> on its own
  // line ends the value, with and without a schema.
  for (const Json& tools : {kWriteTool, Json()}) {
    expect_every_chunking(
        "<tool_call>\n<function=write_file>\n<parameter=path>\np\n<parameter=content>\nc\n"
        "</function>\n</tool_call>",
        tools, ParsedReply{.tool_calls = {call("write_file", {{"path", "p"}, {"content", "c"}})}});
    expect_every_chunking("<tool_call>\n<function=write_file>\n<parameter=path>\np\n</tool_call>",
                          tools, ParsedReply{.tool_calls = {call("write_file", {{"path", "p"}})}});
    expect_every_chunking(
        "<tool_call>\n<function=write_file>\n<parameter=path>\np\n</function>\nDone.", tools,
        ParsedReply{.content = "Done.", .tool_calls = {call("write_file", {{"path", "p"}})}});
  }
  // But a value that holds those tags and closes properly later is not cut.
  for (const std::string& content :
       {std::string("x\n</function>\n</parameter>"), std::string("x\n</tool_call>\n</parameter>"),
        std::string("x\n</function>\n</tool_call>\n</parameter>")}) {
    const std::string value = content.substr(0, content.size() - 13);
    expect_every_chunking("<tool_call>\n<function=write_file>\n<parameter=content>\n" + content +
                              "\n</function>\n</tool_call>",
                          kWriteTool,
                          ParsedReply{.tool_calls = {call("write_file", {{"content", value}})}});
  }
}

TEST(ChatParseMarkup, ParameterGivenTwiceKeepsTheFirst) {
  expect_every_chunking(
      "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\nstray\n<parameter=b>\n2\n"
      "</parameter>\n</function>",
      Json(),
      ParsedReply{.tool_calls = {call("f", {{"a", "1\n</parameter>\nstray"}, {"b", "2"}})}});
  expect_every_chunking(
      "<function=f>\n<parameter=a>\n1\n</parameter>\n</parameter>\n<parameter=a>\n2\n"
      "</parameter>\n</function>",
      Json(),
      ParsedReply{.tool_calls = {call("f", {{"a",
                                             "1\n</parameter>\n</parameter>\n"
                                             "<parameter=a>\n2"}})}});
}

TEST(ChatParseMarkup, ArgumentsStreamAsTheyAreGenerated) {
  // Typed and string values, JSON escapes, Unicode; whole, and cut off anywhere.
  const std::string text =
      "<tool_call>\n<function=f>\n<parameter=i>\n42\n</parameter>\n<parameter=s>\n"
      "h\xC3\xA9 \"q\" \\ \t\x01 \xF0\x9F\x98\x80 \xE4\xB8\x96\n\n</parameter>\n<parameter=o>\n"
      "{\"z\": [1, 2.5], \"a\": null}\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n"
      "<parameter=n>\nnot a number\n</parameter>\n</function>\n</tool_call>";
  const Json arguments = {{"i", 42},
                          {"s", "h\xC3\xA9 \"q\" \\ \t\x01 \xF0\x9F\x98\x80 \xE4\xB8\x96\n"},
                          {"o", Json::parse(R"({"z": [1, 2.5], "a": null})")},
                          {"b", true},
                          {"n", "not a number"}};
  expect_every_chunking(text, kTools, ParsedReply{.tool_calls = {call("f", arguments)}});
  for (size_t cut = 0; cut < text.size(); ++cut) {
    // run_chunked checks the fragments against every call's arguments, complete or cut off.
    const std::string part = text.substr(0, cut);
    const ReplyParserOptions options{.starts_in_reasoning = false, .tools = kTools};
    const ChunkedRun whole = run_chunked(part, options, [&] { return part.size(); });
    EXPECT_EQ(run_chunked(part, options, [] { return size_t{1}; }).events, whole.events);
    EXPECT_EQ(run_chunked(part, options, [] { return size_t{3}; }).events, whole.events);
  }
  // A string value streams before it ends; the format's newline and a candidate end wait.
  ReplyParser parser({.starts_in_reasoning = false, .tools = kWriteTool});
  std::string args;
  const auto feed = [&](std::string_view chunk) {
    for (const ReplyEvent& e : parser.feed(chunk)) {
      if (e.kind == ReplyEvent::Kind::kToolCallArgs) args += e.text;
    }
    return args;
  };
  feed("<tool_call>\n<function=write_file>\n<parameter=path>\n");
  EXPECT_EQ(args, R"({"path":")");
  EXPECT_EQ(feed("a/b\"c"), R"({"path":"a/b\"c)");
  EXPECT_EQ(feed("\n"), R"({"path":"a/b\"c)");
  EXPECT_EQ(feed("</parameter>\n"), R"({"path":"a/b\"c)");
  EXPECT_EQ(feed("tail"), R"({"path":"a/b\"c\n</parameter>\ntail)");
  EXPECT_EQ(feed("\n</parameter>\n<parameter=mode>\n"),
            R"({"path":"a/b\"c\n</parameter>\ntail","mode":)");
  EXPECT_EQ(feed("7\n</parameter>\n<"), R"({"path":"a/b\"c\n</parameter>\ntail","mode":)");
  // The last </parameter> is decided by what follows </tool_call>: here the end of the reply.
  EXPECT_EQ(feed("/function>\n</tool_call>"), R"({"path":"a/b\"c\n</parameter>\ntail","mode":)");
  for (const ReplyEvent& e : parser.finish()) {
    if (e.kind == ReplyEvent::Kind::kToolCallArgs) args += e.text;
  }
  EXPECT_EQ(args, R"({"path":"a/b\"c\n</parameter>\ntail","mode":7})");
  EXPECT_EQ(args, dump_arguments(parser.result().tool_calls.at(0)));
}

}  // namespace
}  // namespace qwenrt::chat
