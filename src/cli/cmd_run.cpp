// `qwenrt run [-m MODEL] -p PROMPT [--no-think] ...`: one question, the streamed answer.
#include <fstream>

#include "cli/commands.h"
#include "cli/session.h"
#include "core/error.h"

namespace qwenrt::cli {
namespace {

struct RunOptions {
  TurnOptions turn;
  std::string prompt;
  std::string tools;  // JSON file: an array of tool definitions
};

int run_run(const RunOptions& opt) {
  require_utf8(opt.prompt, "the prompt");
  chat::Json messages = start_messages(opt.turn);
  Session session(opt.turn);
  messages.push_back({{"role", "user"}, {"content", opt.prompt}});
  chat::Json tools = nullptr;
  if (!opt.tools.empty()) {
    std::ifstream in(opt.tools);
    if (!in) fail("{}: cannot open --tools", opt.tools);
    try {
      tools = chat::Json::parse(in);
    } catch (const std::exception& e) {
      fail("{}: invalid JSON in --tools: {}", opt.tools, e.what());
    }
    if (!tools.is_array())
      fail("{}: --tools must hold a JSON array of tool definitions", opt.tools);
  }
  session.reply(messages, !opt.turn.no_think, tools);
  return 0;
}

}  // namespace

Run add_run(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  auto* sub = app.add_subcommand("run", "Answer one prompt, streaming the reply");
  add_turn_options(sub, opt->turn);
  sub->add_option("-p,--prompt", opt->prompt, "The user message")->required();
  sub->add_option("--tools", opt->tools,
                  "JSON file: an array of tool definitions the model may call");
  return [opt] { return run_run(*opt); };
}

}  // namespace qwenrt::cli
