// `--backend auto|cuda|cpu|ref`, `-t/--threads N`, `--tensor-parallel N`, `--[no-]expert-parallel`
// and `--pipeline-parallel N`, the same on every command that runs a model.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "engine/engine.h"

namespace qwenrt::cli {

struct BackendOptions {
  std::string backend = "auto";  // cuda when a GPU is usable, else cpu
  int threads = 0;               // 0: the physical cores
  double expert_cache_gib = -1;  // < 0: auto
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  bool expert_parallel = true;
};

inline void add_backend_options(CLI::App* sub, BackendOptions& opt) {
  sub->add_option("--backend", opt.backend,
                  "Compute backend: auto (cuda when a GPU is usable, else cpu), cuda, cpu (SIMD, "
                  "threads) or ref (oracle)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu", "ref"}));
  sub->add_option("-t,--threads", opt.threads, "cpu backend threads (default: physical cores)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--expert-cache", opt.expert_cache_gib,
                  "GiB of memory for routed MoE experts read from the file on demand (cpu "
                  "backend); 0 = off (experts mapped with the rest); default: on, with the free "
                  "memory, when the file is larger than 80% of it")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--tensor-parallel", opt.tensor_parallel,
                  "Split the model over N backends (attention and DeltaNet heads, FFN width, "
                  "experts, LM head rows), one thread each; cpu and ref backends today")
      ->check(CLI::Range(1, 64));
  sub->add_flag(
      "--expert-parallel,!--no-expert-parallel", opt.expert_parallel,
      "With --tensor-parallel on a MoE model: each rank holds whole routed experts "
      "(default); --no-expert-parallel splits every expert's width over the ranks instead "
      "(a copy of each rank's slice)");
  sub->add_option("--pipeline-parallel", opt.pipeline_parallel,
                  "Split the model's layers into N stages run one after another, each on its "
                  "own backend (with --tensor-parallel, on its own group of them); cpu and ref "
                  "backends today")
      ->check(CLI::Range(1, 64));
}

inline void apply(const BackendOptions& opt, engine::EngineOptions& eo) {
  eo.backend = opt.backend;
  eo.n_threads = opt.threads;
  eo.tensor_parallel = opt.tensor_parallel;
  eo.pipeline_parallel = opt.pipeline_parallel;
  eo.expert_parallel = opt.expert_parallel;
  eo.expert_cache_bytes =
      opt.expert_cache_gib < 0 ? -1 : static_cast<int64_t>(opt.expert_cache_gib * (1ull << 30));
}

}  // namespace qwenrt::cli
