// `qwenrt logits -m MODEL (--ids 1,2,3 | --prompt TEXT) --out FILE.npy [--decode]`: float32
// logits [n_tokens, n_vocab] for every position, the parity entry point for any harness.
#include <fmt/format.h>

#include <sstream>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/model_option.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/npy.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::cli {
namespace {

struct LogitsOptions {
  ModelOption model;
  std::string ids;
  std::string prompt;
  std::string out;
  bool decode = false;
  std::string deltanet = "auto";
  std::string mtp_out;
  BackendOptions backend;
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
  apply(opt.backend, eo);
  if (opt.deltanet == "recurrent") {
    eo.deltanet_mode = arch::DeltaNetMode::kRecurrent;
  } else if (opt.deltanet == "chunked") {
    eo.deltanet_mode = arch::DeltaNetMode::kChunked;
  } else if (opt.deltanet != "auto") {
    fail("--deltanet: expected auto, recurrent or chunked, got '{}'", opt.deltanet);
  }
  const std::string path = resolve_model(opt.model, true);
  auto engine = engine::Engine::load(path, eo);
  std::vector<int32_t> ids;
  if (!opt.prompt.empty()) {
    // Control tokens in the text are parsed, so a rendered chat prompt tokenizes as the model saw
    // it.
    ids = tokenizer::Tokenizer::from_gguf(engine->file()).encode(opt.prompt, true);
    if (ids.empty()) fail("--prompt: the text has no tokens");
  } else {
    ids = parse_ids(opt.ids);
  }
  const int64_t n_vocab = engine->config().n_vocab;
  if (static_cast<int64_t>(ids.size()) > engine->states().n_ctx()) {
    fail("{} tokens exceed the context of {}", ids.size(), engine->states().n_ctx());
  }
  if (!opt.mtp_out.empty() && !engine->has_mtp()) fail("--mtp-out: {} has no MTP block", path);
  std::vector<float> all, hidden;
  all.reserve(ids.size() * n_vocab);
  if (opt.decode) {
    for (size_t i = 0; i < ids.size(); ++i) {
      engine::Batch b;
      b.add(0, ids[i], static_cast<int32_t>(i), true);
      auto out = engine->step_with_hidden(b);
      all.insert(all.end(), out.logits.begin(), out.logits.end());
      hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
    }
  } else {
    engine::Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(0, ids[i], static_cast<int32_t>(i), true);
    auto out = engine->step_with_hidden(b);
    all = std::move(out.logits);
    hidden = std::move(out.hidden);
  }
  write_npy_f32(opt.out, all.data(), {static_cast<int64_t>(ids.size()), n_vocab});
  fmt::print(stderr, "qwenrt: wrote logits [{}, {}] to {}\n", ids.size(), n_vocab, opt.out);
  if (!opt.mtp_out.empty() && ids.size() > 1) {
    // Row p: the MTP draft for position p + 2 from the hidden state at p and the token at p + 1.
    const int64_t n_embd = engine->config().n_embd, rows = static_cast<int64_t>(ids.size()) - 1;
    engine::MtpBatch m;
    for (int64_t p = 0; p < rows; ++p) {
      m.slots.push_back(0);
      m.tokens.push_back(ids[p + 1]);
      m.positions.push_back(static_cast<int32_t>(p));
    }
    m.hidden.assign(hidden.begin(), hidden.begin() + rows * n_embd);
    const auto drafts = engine->mtp_step(m);
    write_npy_f32(opt.mtp_out, drafts.data(), {rows, n_vocab});
    fmt::print(stderr, "qwenrt: wrote MTP draft logits [{}, {}] to {}\n", rows, n_vocab,
               opt.mtp_out);
  }
  return 0;
}

}  // namespace

Run add_logits(CLI::App& app) {
  auto opt = std::make_shared<LogitsOptions>();
  auto* sub = app.add_subcommand(
      "logits", "Write float32 logits [n_tokens, n_vocab] of every position to a .npy file");
  add_model_option(sub, opt->model, "Model");
  add_backend_options(sub, opt->backend);
  auto* ids = sub->add_option("--ids", opt->ids, "Comma-separated token ids");
  auto* prompt =
      sub->add_option("--prompt", opt->prompt, "Text, tokenized with the model's tokenizer");
  ids->excludes(prompt);
  sub->add_option("--out", opt->out, "Output .npy file")->required();
  sub->add_flag("--decode", opt->decode, "Feed one token per step instead of one prefill");
  sub->add_option("--deltanet", opt->deltanet, "DeltaNet prefill form: auto, recurrent or chunked");
  sub->add_option("--mtp-out", opt->mtp_out,
                  "Also write the MTP block's draft logits [n_tokens - 1, n_vocab]: row p drafts "
                  "position p + 2");
  sub->callback([ids, prompt] {
    if (ids->count() == 0 && prompt->count() == 0)
      throw CLI::ValidationError("--ids or --prompt is required");
  });
  return [opt] { return run_logits(*opt); };
}

}  // namespace qwenrt::cli
