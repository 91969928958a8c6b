// `qwenrt perplexity -m MODEL -f FILE [--ctx N] [--score half|all] [--kl-base BASE.npy]
// [--save-logits OUT.npy]`: perplexity of a text, scored the way llama.cpp's llama-perplexity
// does, and the KL divergence of this model's next-token distributions from a saved base run
// (a quantization against its F16/Q8_0 original). docs/synth.md, "Perplexity".
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/npy.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::cli {
namespace {

struct PerplexityOptions {
  ModelOption model;
  std::string file;
  int64_t ctx = 512;
  std::string score = "half";
  int64_t max_chunks = 0;
  int64_t batch = 0;
  std::string kl_base;
  std::string save_logits;
  BackendOptions backend;
};

// Mean and standard error of the mean of a stream of values.
struct Stat {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(double v) {
    sum += v;
    sum2 += v * v;
    ++n;
  }
  double mean() const { return n ? sum / n : 0.0; }
  double stderr_of_mean() const {
    if (n < 2) return 0.0;
    const double var = std::max(0.0, sum2 / n - mean() * mean());
    return std::sqrt(var / (n - 1));
  }
};

// log-softmax of one row of logits, accumulated in double.
void log_softmax(const float* logits, int64_t n, float* out) {
  const float max = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - max);
  const double log_z = max + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(logits[i] - log_z);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open the text file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The base run's rows: [n_scored, n_vocab + 1] float32, log-probabilities of every token, then
// the id of the token that followed (so a base of a different text or tokenization is caught).
struct Base {
  NpyArray array;
  int64_t row_width = 0;
  const float* row(int64_t i) const { return array.data.data() + i * row_width; }
};

Base load_base(const std::string& path, int64_t n_scored, int64_t n_vocab) {
  Base b{read_npy_f32(path), n_vocab + 1};
  if (b.array.shape.size() != 2 || b.array.shape[0] != n_scored ||
      b.array.shape[1] != n_vocab + 1) {
    std::string shape;
    for (int64_t d : b.array.shape) shape += fmt::format("{}{}", shape.empty() ? "" : ", ", d);
    fail(
        "{}: --kl-base holds [{}], this run scores [{}, {}] (scored tokens, vocabulary + 1): the "
        "same text, --ctx, --score and vocabulary are needed",
        path, shape, n_scored, n_vocab + 1);
  }
  return b;
}

int run_perplexity(const PerplexityOptions& opt) {
  if (opt.ctx < 2) fail("--ctx: expected at least 2, got {}", opt.ctx);
  if (opt.score != "half" && opt.score != "all") {
    fail("--score: expected half or all, got '{}'", opt.score);
  }
  engine::EngineOptions eo;
  apply(opt.backend, eo);
  eo.n_ctx = opt.ctx;
  auto engine = engine::Engine::load(resolve_model(opt.model), eo);
  const auto tok = tokenizer::Tokenizer::from_gguf(engine->file());
  const int64_t n_vocab = engine->config().n_vocab;

  const std::string text = read_text(opt.file);
  const std::vector<int32_t> ids = tok.encode(text, /*parse_special=*/false);
  int64_t n_chunks = static_cast<int64_t>(ids.size()) / opt.ctx;
  if (opt.max_chunks > 0) n_chunks = std::min(n_chunks, opt.max_chunks);
  if (n_chunks == 0) {
    fail("{}: {} tokens, fewer than one chunk of --ctx {}", opt.file, ids.size(), opt.ctx);
  }
  // llama.cpp scores the second half of each chunk: every scored token then has at least ctx/2
  // tokens of context, so the figure does not depend on how the text was cut.
  const int64_t first = opt.score == "all" ? 0 : opt.ctx / 2;
  const int64_t scored_per_chunk = opt.ctx - 1 - first;
  const int64_t n_scored = n_chunks * scored_per_chunk;
  const int64_t batch = opt.batch > 0 ? opt.batch : opt.ctx;

  const bool keep_rows = !opt.kl_base.empty() || !opt.save_logits.empty();
  std::optional<Base> base;
  if (!opt.kl_base.empty()) base = load_base(opt.kl_base, n_scored, n_vocab);
  std::vector<float> saved;
  if (!opt.save_logits.empty()) saved.resize(static_cast<size_t>(n_scored * (n_vocab + 1)));

  fmt::print(stderr,
             "qwenrt: perplexity over {} tokens: {} chunks of {}, scoring {} ({} tokens each)\n",
             ids.size(), n_chunks, opt.ctx, opt.score == "all" ? "all positions" : "second halves",
             scored_per_chunk);
  Stat nll, kld, top1;
  std::vector<double> klds;
  std::vector<float> logp(static_cast<size_t>(n_vocab));
  int64_t row_index = 0;
  for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
    engine->states().reset(0);  // every chunk from a fresh sequence state
    const int32_t* chunk_ids = ids.data() + chunk * opt.ctx;
    for (int64_t start = 0; start < opt.ctx; start += batch) {
      const int64_t end = std::min(opt.ctx, start + batch);
      engine::Batch b;
      for (int64_t j = start; j < end; ++j) {
        b.add(0, chunk_ids[j], static_cast<int32_t>(j), j >= first && j < opt.ctx - 1);
      }
      const std::vector<float> logits = engine->step(b);
      int64_t r = 0;
      for (int64_t j = std::max(start, first); j < std::min(end, opt.ctx - 1); ++j, ++r) {
        const int32_t target = chunk_ids[j + 1];
        log_softmax(logits.data() + r * n_vocab, n_vocab, logp.data());
        nll.add(-double(logp[target]));
        if (keep_rows) {
          if (!saved.empty()) {
            float* dst = saved.data() + row_index * (n_vocab + 1);
            std::copy(logp.begin(), logp.end(), dst);
            dst[n_vocab] = static_cast<float>(target);
          }
          if (base) {
            const float* lb = base->row(row_index);
            if (lb[n_vocab] != static_cast<float>(target)) {
              fail("{}: scored token {} is id {} in the base run, {} here: not the same text",
                   opt.kl_base, row_index, lb[n_vocab], target);
            }
            // KL(base || this) = sum p_base (log p_base - log p_this).
            double kl = 0;
            for (int64_t i = 0; i < n_vocab; ++i) {
              kl += std::exp(double(lb[i])) * (double(lb[i]) - double(logp[i]));
            }
            kld.add(kl);
            klds.push_back(kl);
            const auto argmax = [n_vocab](const float* v) {
              return std::max_element(v, v + n_vocab) - v;
            };
            top1.add(argmax(lb) == argmax(logp.data()) ? 1.0 : 0.0);
          }
          ++row_index;
        }
      }
    }
    fmt::print(stderr, "[{}]{:.4f}{}", chunk + 1, std::exp(nll.mean()),
               chunk + 1 == n_chunks ? "\n" : ",");
  }

  const double ppl = std::exp(nll.mean());
  fmt::print("PPL = {:.6f} +/- {:.6f}  ({} tokens scored, {} chunks of {}, {})\n", ppl,
             ppl * nll.stderr_of_mean(), nll.n, n_chunks, opt.ctx,
             opt.score == "all" ? "all positions" : "second halves");
  if (base) {
    std::sort(klds.begin(), klds.end());
    fmt::print("Mean KLD = {:.8f} +/- {:.8f}  (median {:.8f}, max {:.8f})\n", kld.mean(),
               kld.stderr_of_mean(), klds[klds.size() / 2], klds.back());
    fmt::print("Same top-1 = {:.4f} % +/- {:.4f} %\n", 100.0 * top1.mean(),
               100.0 * top1.stderr_of_mean());
  }
  if (!opt.save_logits.empty()) {
    write_npy_f32(opt.save_logits, saved.data(), {n_scored, n_vocab + 1});
    fmt::print(stderr, "qwenrt: saved log-probs [{}, {} + 1] to {}\n", n_scored, n_vocab,
               opt.save_logits);
  }
  return 0;
}

}  // namespace

Run add_perplexity(CLI::App& app) {
  auto opt = std::make_shared<PerplexityOptions>();
  auto* sub = app.add_subcommand(
      "perplexity", "Perplexity of a text file; KL divergence against a saved base run");
  add_model_option(sub, opt->model, "Model (default: the embedded model)");
  add_backend_options(sub, opt->backend);
  sub->add_option("-f,--file", opt->file, "Text file (special tokens are not parsed)")->required();
  sub->add_option("--ctx", opt->ctx,
                  "Tokens per chunk; each chunk starts from a fresh state (512)");
  sub->add_option("--score", opt->score,
                  "half: the second half of each chunk, as llama.cpp (default); all: every "
                  "position");
  sub->add_option("--chunks", opt->max_chunks, "Evaluate at most this many chunks");
  sub->add_option("--batch", opt->batch, "Tokens per engine step (default: the whole chunk)");
  sub->add_option("--kl-base", opt->kl_base,
                  "Report KL divergence and top-1 agreement against this --save-logits file");
  sub->add_option("--save-logits", opt->save_logits,
                  "Save log-probs of every scored position (float32 [scored, n_vocab + 1]; the "
                  "last column is the next token's id)");
  return [opt] { return run_perplexity(*opt); };
}

}  // namespace qwenrt::cli
