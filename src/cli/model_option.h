// `-m` / `--hf` (`-hf`) on every command that opens a model, and their resolution through the hub:
// a path, an official checkpoint name (`Qwen3.6-27B[:QUANT]`) or `ORG/REPO[:FILE|:QUANT]`.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "hub/resolve.h"

namespace qwenrt::cli {

struct ModelOption {
  std::string model;  // -m: a path, or a name / repo when no such file exists
  std::string hf;     // --hf: always a name or repo on the hub
};

// Adds -m,--model and --hf (main() turns llama.cpp's `-hf` into `--hf`).
void add_model_option(CLI::App* sub, ModelOption& option, const std::string& help);

// The hub settings from the environment, drawing download progress and notes on stderr.
hub::HubOptions cli_hub_options();

// The file to open: -m or --hf resolved (downloaded if needed), else the embedded default model
// (Error when there is none, or when `required` and neither was given).
hub::Resolved resolve_model_ref(const ModelOption& option, bool required = false);
std::string resolve_model(const ModelOption& option, bool required = false);

}  // namespace qwenrt::cli
