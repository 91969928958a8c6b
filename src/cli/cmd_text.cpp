// `qwenrt tokenize -m MODEL [--special] TEXT` and `qwenrt template -m MODEL --messages FILE.json
// [--tools FILE.json] [--no-think]`: the tokenizer and the chat template, for any harness.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "chat/render.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "model/identity.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::cli {
namespace {

struct TokenizeOptions {
  ModelOption model;
  bool special = false;
  std::string text;
};

struct TemplateOptions {
  ModelOption model;
  std::string messages;
  std::string tools;
  bool no_think = false;
  bool no_generation_prompt = false;
  std::string dialect;
};

chat::Json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open {}", path, what);
  try {
    return chat::Json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: invalid JSON in {}: {}", path, what, e.what());
  }
}

int run_tokenize(const TokenizeOptions& opt) {
  const gguf::File file = gguf::File::open(resolve_model(opt.model)).value();
  const auto tok = tokenizer::Tokenizer::from_gguf(file);
  const auto ids = tok.encode(opt.text, opt.special);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += fmt::format("{}{}", i ? " " : "", ids[i]);
  std::puts(out.c_str());
  return 0;
}

int run_template(const TemplateOptions& opt) {
  const gguf::File file = gguf::File::open(resolve_model(opt.model)).value();
  chat::Dialect dialect = chat::dialect_for(model::identify(file).checkpoint);
  if (!opt.dialect.empty()) {
    auto d = chat::dialect_from_name(opt.dialect);
    if (!d) fail("--dialect: expected qwen3.5, qwen3.6 or qwen3.8, got '{}'", opt.dialect);
    dialect = *d;
  }
  const chat::Json messages = read_json(opt.messages, "--messages");
  const chat::Json tools =
      opt.tools.empty() ? chat::Json(nullptr) : read_json(opt.tools, "--tools");
  chat::RenderOptions ro;
  ro.enable_thinking = !opt.no_think;
  ro.add_generation_prompt = !opt.no_generation_prompt;
  const std::string text = chat::render_chat(dialect, messages, tools, ro);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

Run add_tokenize(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand("tokenize", "Print the token ids of a text, separated by spaces");
  add_model_option(sub, opt->model, "Model (its tokenizer)");
  sub->add_flag("--special", opt->special,
                "Recognise control tokens such as <|im_end|> in the text");
  sub->add_option("text", opt->text, "Text to tokenize")->required();
  return [opt] { return run_tokenize(*opt); };
}

Run add_template(CLI::App& app) {
  auto opt = std::make_shared<TemplateOptions>();
  auto* sub = app.add_subcommand("template",
                                 "Print a conversation rendered with the model's chat template");
  add_model_option(sub, opt->model, "Model (decides the dialect)");
  sub->add_option("--messages", opt->messages, "JSON file: an array of messages")->required();
  sub->add_option("--tools", opt->tools, "JSON file: an array of tool definitions");
  sub->add_flag("--no-think", opt->no_think, "Generation prompt with thinking off");
  sub->add_flag("--no-generation-prompt", opt->no_generation_prompt,
                "No assistant prompt at the end");
  sub->add_option("--dialect", opt->dialect, "Override: qwen3.5, qwen3.6 or qwen3.8");
  return [opt] { return run_template(*opt); };
}

}  // namespace qwenrt::cli
