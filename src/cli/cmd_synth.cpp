// `qwenrt synth --like CHECKPOINT --quant Q4_K_M|Q8_0 [--layers N] [--ple-rows-scale S] --out FILE
// [--seed S]`: a full-size GGUF with the official conversion's metadata, tensor table and
// per-tensor types, a 248320-entry vocabulary, and random but well-scaled weights: the same bytes
// move as with the real checkpoint, so it measures speed (never quality). docs/synth.md. The file
// is streamed as it is generated (Qwen3.8-Flash-Next's PLE table alone is 35 GB in Q4_K_M).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "model/synth.h"

namespace qwenrt::cli {
namespace {

struct SynthOptions {
  std::string like;
  std::string quant = "Q4_K_M";
  int layers = 0;
  std::string out;
  uint64_t seed = 1;
  int threads = 0;
  std::string vocab;
  std::string chat_template;
  bool mtp = false;
  int64_t ple_rows_scale = 1;
};

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open {}", path, what);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_synth(const SynthOptions& opt) {
  model::SynthSpec spec =
      model::synth_spec_like(opt.like, opt.quant, opt.layers, opt.mtp, opt.ple_rows_scale);
  spec.n_threads = opt.threads;
  spec.seed = opt.seed;
  spec.vocab_from = opt.vocab;
  if (!opt.chat_template.empty()) {
    spec.chat_template = read_text(opt.chat_template, "--chat-template");
  }

  uint64_t planned = 0;
  const auto table = model::synth_tensor_table(spec);
  std::string ple;
  for (const auto& t : table) {
    planned += t.n_bytes;
    if (t.name == "per_layer_token_embd.weight") {
      ple =
          fmt::format(" (PLE table {} x {} {}: {:.2f} GB{})", t.ne[0], t.ne[1], dtype_name(t.type),
                      t.n_bytes / 1e9,
                      opt.ple_rows_scale > 1 ? fmt::format(", n-gram base / {}", opt.ple_rows_scale)
                                             : std::string());
    }
  }
  fmt::print(stderr, "qwenrt: synth {} {}, {} layers{}, {} tensors, {:.2f} GB of weights{} -> {}\n",
             spec.name, opt.quant, spec.config.n_layer, opt.mtp ? " + MTP" : "", table.size(),
             planned / 1e9, ple, opt.out);
  const auto start = std::chrono::steady_clock::now();
  model::write_synthetic(spec, opt.out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;  // --out /dev/null (generation speed alone) has no size
  uint64_t bytes = std::filesystem::file_size(opt.out, ec);
  if (ec) bytes = planned;
  fmt::print(stderr, "qwenrt: wrote {} bytes in {:.1f} s ({:.2f} GB/s)\n", bytes, seconds,
             bytes / 1e9 / seconds);
  return 0;
}

}  // namespace

Run add_synth(CLI::App& app) {
  auto opt = std::make_shared<SynthOptions>();
  auto* sub = app.add_subcommand(
      "synth",
      "Write a synthetic GGUF shaped exactly like an official checkpoint (for speed work)");
  sub->add_option("--like", opt->like,
                  "Qwen3.6-27B, Qwen3.6-35B-A3B, Qwen3.8-27B or Qwen3.8-Flash-Next")
      ->required();
  sub->add_option("--quant", opt->quant, "Q4_K_M (default) or Q8_0");
  sub->add_option("--layers", opt->layers, "Only the first N layers (a small file for checks)");
  sub->add_option("--out", opt->out, "Output .gguf file")->required();
  sub->add_flag("--mtp", opt->mtp,
                "Add one MTP (nextn) block after the trunk, nextn_predict_layers = 1");
  sub->add_option("--ple-rows-scale", opt->ple_rows_scale,
                  "Qwen3.8-Flash-Next: divide the PLE n-gram vocabulary base (20,000,000) by S, "
                  "deriving heads, offsets and table rows from it as transformers does: a PLE "
                  "table ~1/S of its 35 GB (Q4_K_M) / 54 GB (Q8_0) (default 1: full size)");
  sub->add_option("--seed", opt->seed, "Random seed (default 1)");
  sub->add_option("--threads", opt->threads, "Threads generating weights (default: all cores)");
  sub->add_option("--vocab", opt->vocab,
                  "Copy tokenizer.* keys from this GGUF (248320 tokens) instead of the synthetic "
                  "vocabulary");
  sub->add_option("--chat-template", opt->chat_template,
                  "Store this file as tokenizer.chat_template");
  return [opt] { return run_synth(*opt); };
}

}  // namespace qwenrt::cli
