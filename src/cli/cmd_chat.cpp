// `qwenrt chat [-m MODEL]`: an interactive chat with history. Commands: /reset, /think on|off,
// /exit. A line ending in '\' continues on the next line; a line of """ starts or ends a block.
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>

#include "cli/commands.h"
#include "cli/session.h"
#include "tokenizer/utf8.h"

namespace qwenrt::cli {
namespace {

// Reads one user message; nullopt at end of input.
std::optional<std::string> read_message(bool tty) {
  std::string message, line;
  bool block = false;
  if (tty) std::fputs("\x1b[1m> \x1b[0m", stdout), std::fflush(stdout);
  while (std::getline(std::cin, line)) {
    if (line == "\"\"\"") {
      if (block) return message;
      block = true;
      continue;
    }
    if (block) {
      message += line + "\n";
      continue;
    }
    if (!line.empty() && line.back() == '\\') {
      message += line.substr(0, line.size() - 1) + "\n";
      continue;
    }
    return message + line;
  }
  if (!message.empty()) return message;
  return std::nullopt;
}

int run_chat(const TurnOptions& opt) {
  chat::Json messages = start_messages(opt);
  Session session(opt, /*multi_turn=*/true);
  const bool tty = isatty(STDIN_FILENO);
  bool thinking = !opt.no_think;
  if (tty)
    std::fputs("qwenrt chat: /reset, /think on|off, /exit; end a line with \\ to continue it\n",
               stdout);
  while (auto input = read_message(tty)) {
    const std::string& text = *input;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      messages = start_messages(opt);
      std::puts("(history cleared)");
      continue;
    }
    if (text == "/think on" || text == "/think off") {
      thinking = text == "/think on";
      std::printf("(thinking %s)\n", thinking ? "on" : "off");
      continue;
    }
    if (text.empty()) continue;
    if (!tokenizer::is_valid_utf8(text)) {
      std::puts("(that message is not valid UTF-8; not sent)");
      continue;
    }
    if (text[0] == '/') {
      std::printf("unknown command %s (try /reset, /think on|off, /exit)\n", text.c_str());
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", text}});
    const chat::ParsedReply r = session.reply(messages, thinking);
    chat::Json assistant = {{"role", "assistant"}, {"content", r.content}};
    if (!r.reasoning.empty()) assistant["reasoning_content"] = r.reasoning;
    messages.push_back(assistant);
  }
  return 0;
}

}  // namespace

Run add_chat(CLI::App& app) {
  auto opt = std::make_shared<TurnOptions>();
  auto* sub = app.add_subcommand("chat", "Interactive chat with history");
  add_turn_options(sub, *opt);
  return [opt] { return run_chat(*opt); };
}

}  // namespace qwenrt::cli
