// `qwenrt logits -m MODEL (--ids 1,2,3 | --prompt TEXT) --out FILE.npy [--decode]`: float32
// logits [n_tokens, n_vocab] for every position, the parity entry point for any harness.
#include <fmt/format.h>

#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/npy.h"

namespace qwenrt::cli {
namespace {

struct LogitsOptions {
  std::string model;
  std::string ids;
  std::string prompt;
  std::string out;
  bool decode = false;
  std::string deltanet = "auto";
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
      fail("--ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) fail("--ids: no token ids given");
  return ids;
}

int run_logits(const LogitsOptions& opt) {
  engine::EngineOptions eo;
  if (opt.deltanet == "recurrent") {
    eo.deltanet_mode = arch::DeltaNetMode::kRecurrent;
  } else if (opt.deltanet == "chunked") {
    eo.deltanet_mode = arch::DeltaNetMode::kChunked;
  } else if (opt.deltanet != "auto") {
    fail("--deltanet: expected auto, recurrent or chunked, got '{}'", opt.deltanet);
  }
  if (!opt.prompt.empty()) {
    fail("--prompt needs the tokenizer, which this build does not have yet; pass --ids");
  }
  const std::vector<int32_t> ids = parse_ids(opt.ids);
  auto engine = engine::Engine::load(opt.model, eo);
  const int64_t n_vocab = engine->config().n_vocab;
  if (static_cast<int64_t>(ids.size()) > engine->states().n_ctx()) {
    fail("{} tokens exceed the context of {}", ids.size(), engine->states().n_ctx());
  }
  std::vector<float> all;
  all.reserve(ids.size() * n_vocab);
  if (opt.decode) {
    for (size_t i = 0; i < ids.size(); ++i) {
      engine::Batch b;
      b.add(0, ids[i], static_cast<int32_t>(i), true);
      auto l = engine->step(b);
      all.insert(all.end(), l.begin(), l.end());
    }
  } else {
    engine::Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(0, ids[i], static_cast<int32_t>(i), true);
    all = engine->step(b);
  }
  write_npy_f32(opt.out, all.data(), {static_cast<int64_t>(ids.size()), n_vocab});
  fmt::print(stderr, "qwenrt: wrote logits [{}, {}] to {}\n", ids.size(), n_vocab, opt.out);
  return 0;
}

}  // namespace

Run add_logits(CLI::App& app) {
  auto opt = std::make_shared<LogitsOptions>();
  auto* sub = app.add_subcommand(
      "logits", "Write float32 logits [n_tokens, n_vocab] of every position to a .npy file");
  sub->add_option("-m,--model", opt->model, "GGUF model")->required();
  auto* ids = sub->add_option("--ids", opt->ids, "Comma-separated token ids");
  auto* prompt =
      sub->add_option("--prompt", opt->prompt, "Text, tokenized with the model's tokenizer");
  ids->excludes(prompt);
  sub->add_option("--out", opt->out, "Output .npy file")->required();
  sub->add_flag("--decode", opt->decode, "Feed one token per step instead of one prefill");
  sub->add_option("--deltanet", opt->deltanet, "DeltaNet prefill form: auto, recurrent or chunked");
  sub->callback([ids, prompt] {
    if (ids->count() == 0 && prompt->count() == 0)
      throw CLI::ValidationError("--ids or --prompt is required");
  });
  return [opt] { return run_logits(*opt); };
}

}  // namespace qwenrt::cli
