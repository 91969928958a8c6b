#include "cli/model_option.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "hub/progress.h"

namespace qwenrt::cli {

void add_model_option(CLI::App* sub, ModelOption& option, const std::string& help) {
  sub->add_option(
      "-m,--model", option.model,
      help + ": a GGUF path, a checkpoint name (Qwen3.6-27B[:QUANT]) or ORG/REPO[:FILE|:QUANT]");
  sub->add_option(
      "--hf", option.hf,
      "A model on the Hugging Face hub: NAME[:QUANT] or ORG/REPO[:FILE|:QUANT] (-hf works too)");
}

hub::HubOptions cli_hub_options() {
  hub::HubOptions o = hub::hub_options(hub::process_env());
  o.progress = hub::stderr_progress();
  o.notice = [](const std::string& line) { fmt::print(stderr, "qwenrt: {}\n", line); };
  return o;
}

hub::Resolved resolve_model_ref(const ModelOption& option, bool required) {
  if (!option.model.empty() && !option.hf.empty())
    fail("-m {} and --hf {}: give one model, not two", option.model, option.hf);
  if (!option.model.empty() || !option.hf.empty()) {
    const bool hub_only = option.model.empty();
    const auto ref = hub::parse_model_ref(hub_only ? option.hf : option.model, hub_only);
    if (ref.is_path) return {.path = ref.path};
    return hub::resolve(ref, cli_hub_options());
  }
  if (required) fail("no model given (-m or --hf)");
  // The embedded default: models/ next to the binary's source tree or the working directory.
  for (const std::string& dir : {std::string(QWENRT_MODELS_DIR), std::string("models")}) {
    const std::string path = dir + "/qwen35-chat-tiny.Q8_0.gguf";
    if (std::filesystem::exists(path)) return {.path = path};
  }
  fail(
      "no model given (-m) and the embedded default model (models/qwen35-chat-tiny.Q8_0.gguf) "
      "is not in this build");
}

std::string resolve_model(const ModelOption& option, bool required) {
  return resolve_model_ref(option, required).path;
}

}  // namespace qwenrt::cli
