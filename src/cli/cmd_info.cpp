// `qwenrt info MODEL [--tensors] [--json]`: what a GGUF file holds, which checkpoint it is and the
// defaults it runs with.
#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "cli/model_option.h"
#include "core/error.h"
#include "gen/defaults.h"
#include "gguf/file_type.h"
#include "gguf/json.h"
#include "gguf/reader.h"
#include "model/identity.h"
#include "tokenizer/tokenizer.h"

namespace qwenrt::cli {
namespace {

struct InfoOptions {
  ModelOption model;
  bool tensors = false;
  bool json = false;
};

std::string human_bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.2f} KiB", n / double(1ull << 10));
  return fmt::format("{} B", n);
}

gen::CheckpointDefaults defaults_of(const gguf::File& file) {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  try {
    tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(file));
  } catch (const Error&) {
    // Any GGUF can be inspected; one without a usable tokenizer just has no stop tokens.
  }
  const std::string arch = file.get_string("general.architecture").value_or("");
  const auto mtp = file.get_uint(arch + ".nextn_predict_layers");
  return gen::checkpoint_defaults(model::identify(file), tok.get(),
                                  mtp ? static_cast<int>(*mtp) : 0);
}

std::string sampling_line(const sample::SamplingParams& p) {
  return fmt::format("temperature {:g}, top_p {:g}, top_k {}, min_p {:g}", p.temperature, p.top_p,
                     p.top_k, p.min_p);
}

void print_defaults(const gen::CheckpointDefaults& d, const hub::Resolved& source) {
  if (d.identity.checkpoint == model::Checkpoint::kOther)
    fmt::print("checkpoint:    none registered (runs as '{}')\n", d.identity.name);
  else
    fmt::print("checkpoint:    {}\n", d.identity.name);
  if (!source.repo.empty())
    fmt::print("source:        {} {} (revision {}, commit {})\n", source.repo, source.file,
               source.revision, source.commit);
  fmt::print("defaults:\n");
  fmt::print("  chat dialect {}\n", chat::dialect_name(d.dialect));
  fmt::print("  thinking     {}\n", sampling_line(d.thinking));
  fmt::print("  no thinking  {}\n", sampling_line(d.non_thinking));
  std::string stops;
  for (const auto& [text, id] : d.stops)
    stops += fmt::format("{}{} {}", stops.empty() ? "" : ", ", text, id);
  fmt::print("  stop tokens  {}\n", stops.empty() ? "(no tokenizer)" : stops);
  if (d.drafter.kind == gen::DrafterKind::kNone)
    fmt::print("  drafter      none\n");
  else if (d.drafter.in_file)
    fmt::print("  drafter      {} ({} block{} in the file), {} drafts a check\n",
               gen::drafter_kind_name(d.drafter.kind), d.drafter.blocks,
               d.drafter.blocks == 1 ? "" : "s", d.drafter.depth);
  else
    fmt::print(
        "  drafter      {} (sidecar {}*.gguf from the same repo, when drafting asks), {} drafts a "
        "check\n",
        gen::drafter_kind_name(d.drafter.kind), gen::drafter_kind_name(d.drafter.kind),
        d.drafter.depth);
}

int run_info(const InfoOptions& opt) {
  const hub::Resolved source = resolve_model_ref(opt.model, true);
  gguf::File file = gguf::File::open(source.path).value();
  const gen::CheckpointDefaults defaults = defaults_of(file);
  if (opt.json) {
    nlohmann::json j = gguf::to_json(file);
    j["qwenrt"] = gen::to_json(defaults);
    if (!source.repo.empty())
      j["qwenrt"]["source"] = {{"repo", source.repo},
                               {"file", source.file},
                               {"revision", source.revision},
                               {"commit", source.commit}};
    std::puts(j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  const auto arch = file.get_string("general.architecture");
  const auto name = file.get_string("general.name");
  const auto file_type = file.get_uint("general.file_type");
  fmt::print("file:          {} ({} bytes, GGUF v{})\n", file.path(), file.file_size(),
             file.version());
  const std::vector<gguf::Part> parts = file.parts();
  if (parts.size() > 1) {
    fmt::print("split:         {} parts\n", parts.size());
    for (const auto& p : parts) fmt::print("  {} ({} bytes)\n", p.path, p.size);
  }
  fmt::print("architecture:  {}\n", arch.value_or("(missing general.architecture)"));
  fmt::print("name:          {}\n", name.value_or("(none)"));
  fmt::print("file type:     {}\n", file_type ? gguf::file_type_name(*file_type) : "(none)");
  print_defaults(defaults, source);

  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (count, bytes)
  uint64_t total = 0;
  for (const auto& t : file.tensors()) {
    auto& [count, bytes] = by_type[std::string(dtype_name(t.dtype))];
    ++count;
    bytes += t.n_bytes;
    total += t.n_bytes;
  }
  fmt::print("tensors:       {} ({})\n", file.tensors().size(), human_bytes(total));
  for (const auto& [type, cb] : by_type) {
    fmt::print("  {:<8} {:>6} tensors  {:>12}\n", type, cb.first, human_bytes(cb.second));
  }
  fmt::print("metadata:      {} keys\n", file.metadata().size());
  for (const auto& kv : file.metadata()) {
    fmt::print("  {} = {}\n", kv.key, kv.value.to_display());
  }
  if (opt.tensors) {
    // The offset in the file holding the tensor (a split GGUF's part, numbered from 1).
    const bool split = parts.size() > 1;
    fmt::print("{:<48} {:<8} {:<28} {:>14}{}\n", "name", "type", "shape", "offset",
               split ? "  part" : "");
    for (const auto& t : file.tensors()) {
      fmt::print("{:<48} {:<8} {:<28} {:>14}{}\n", t.name, dtype_name(t.dtype), t.shape_string(),
                 parts[t.part].data_offset + t.offset,
                 split ? fmt::format("  {:>4}", t.part + 1) : "");
    }
  }
  return 0;
}

}  // namespace

Run add_info(CLI::App& app) {
  auto opt = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "Show a GGUF file's architecture, metadata and tensors");
  sub->add_option("model", opt->model.model,
                  "GGUF path, checkpoint name (Qwen3.6-27B[:QUANT]) or ORG/REPO[:FILE|:QUANT]");
  sub->add_option("--hf", opt->model.hf, "A model on the Hugging Face hub (-hf works too)");
  sub->add_flag("--tensors", opt->tensors,
                "Print the full tensor table (name, type, shape, offset)");
  sub->add_flag("--json", opt->json, "Print metadata and tensor table as JSON (arrays complete)");
  return [opt] { return run_info(*opt); };
}

}  // namespace qwenrt::cli
