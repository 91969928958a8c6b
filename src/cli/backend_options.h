// `--backend auto|cuda|cpu|ref` and `-t/--threads N`, the same on every command that runs a model.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "engine/engine.h"

namespace qwenrt::cli {

struct BackendOptions {
  std::string backend = "auto";  // cuda when a GPU is usable, else cpu
  int threads = 0;               // 0: the physical cores
};

inline void add_backend_options(CLI::App* sub, BackendOptions& opt) {
  sub->add_option("--backend", opt.backend,
                  "Compute backend: auto (cuda when a GPU is usable, else cpu), cuda, cpu (SIMD, "
                  "threads) or ref (oracle)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu", "ref"}));
  sub->add_option("-t,--threads", opt.threads, "cpu backend threads (default: physical cores)")
      ->check(CLI::NonNegativeNumber);
}

inline void apply(const BackendOptions& opt, engine::EngineOptions& eo) {
  eo.backend = opt.backend;
  eo.n_threads = opt.threads;
}

}  // namespace qwenrt::cli
