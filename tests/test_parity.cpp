// Parity of the reference forward pass with two independent implementations on the committed
// fixtures (tests/fixtures/models, made by tools/fixtures/make_models.py; docs/parity.md):
//  - transformers fp32 run on exactly each file's weights: per-position relative L2 < 1e-4 and
//    identical argmax, prompts of 1, 7, 64 and 200 tokens, DeltaNet both chunked and recurrent;
//  - llama.cpp on the same file (see the second test for what can be asked of it).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/npy.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

const std::string kDir = std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/";

nlohmann::json manifest() {
  std::ifstream in(kDir + "manifest.json");
  if (!in) throw std::runtime_error("missing " + kDir + "manifest.json");
  return nlohmann::json::parse(in);
}

std::vector<float> run_prefix(const std::string& gguf, const std::vector<int32_t>& ids, size_t n,
                              arch::DeltaNetMode mode, const std::string& backend = "ref") {
  engine::EngineOptions o;
  o.deltanet_mode = mode;
  o.backend = backend;
  auto e = engine::Engine::load(kDir + gguf, o);
  engine::Batch b;
  for (size_t i = 0; i < n; ++i) b.add(0, ids[i], static_cast<int32_t>(i), true);
  return e->step(b);
}

struct RowStats {
  double worst_rel_l2 = 0;
  double total_rel_l2 = 0;
  int argmax_agree = 0;
  int rows = 0;
};

RowStats compare_rows(const std::vector<float>& ours, const NpyArray& ref, size_t rows,
                      size_t vocab) {
  RowStats s;
  double num = 0, den = 0;
  for (size_t r = 0; r < rows; ++r) {
    std::vector<float> a(ours.begin() + r * vocab, ours.begin() + (r + 1) * vocab);
    std::vector<float> b(ref.data.begin() + r * vocab, ref.data.begin() + (r + 1) * vocab);
    s.worst_rel_l2 = std::max(s.worst_rel_l2, testing_support::rel_l2(a, b));
    for (size_t i = 0; i < vocab; ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    s.argmax_agree += (std::max_element(a.begin(), a.end()) - a.begin()) ==
                      (std::max_element(b.begin(), b.end()) - b.begin());
    ++s.rows;
  }
  s.total_rel_l2 = std::sqrt(num / den);
  return s;
}

// Every committed GGUF with a transformers reference computed on exactly its weights.
TEST(Parity, MatchesTransformersFp32) {
  const auto m = manifest();
  const std::vector<int32_t> ids = m["prompt"]["ids"].get<std::vector<int32_t>>();
  int checked = 0;
  for (const auto& [name, model] : m["models"].items()) {
    for (const auto& [type, g] : model["gguf"].items()) {
      if (!g.value("committed", false) || !g.contains("reference")) continue;
      const std::string file = g["file"];
      const NpyArray want = read_npy_f32(kDir + g["reference"].get<std::string>());
      const size_t vocab = want.shape[1];
      for (size_t n : m["prompt"]["prefix_lengths"].get<std::vector<size_t>>()) {
        for (auto mode : {arch::DeltaNetMode::kChunked, arch::DeltaNetMode::kRecurrent}) {
          if (mode == arch::DeltaNetMode::kRecurrent && n < 64) continue;  // same path as chunked
          const auto ours = run_prefix(file, ids, n, mode);
          const RowStats s = compare_rows(ours, want, n, vocab);
          const std::string what =
              fmt::format("{} prefix {} ({})", file, n,
                          mode == arch::DeltaNetMode::kChunked ? "chunked" : "recurrent");
          EXPECT_LT(s.worst_rel_l2, 1e-4) << what;
          EXPECT_EQ(s.argmax_agree, s.rows) << what;
          std::printf("[parity] %s vs transformers fp32: worst row rel L2 %.3g, argmax %d/%d\n",
                      what.c_str(), s.worst_rel_l2, s.argmax_agree, s.rows);
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 18) << "fewer transformers comparisons than the fixtures promise";
}

// The cpu backend quantises activations to 8 bits as llama.cpp does, so it cannot meet the fp32
// bound above; what it must meet: on every committed file and prompt length, it is no further
// from transformers than llama.cpp is (+10%; +25% on the MoE files, where an activation rounding
// that flips a near-tie router choice moves a whole row: measured 0.116 vs llama.cpp's 0.098 on
// qwen35moe.Q8_0), and agrees with transformers' top-1 at least as often as llama.cpp does (-1
// position). The trained models' test (test_parity_trained.cpp) is the sharper check.
void expect_as_close_to_transformers_as_llama_cpp(const std::string& backend) {
  const auto m = manifest();
  const std::vector<int32_t> ids = m["prompt"]["ids"].get<std::vector<int32_t>>();
  int checked = 0;
  for (const auto& [name, model] : m["models"].items()) {
    for (const auto& [type, g] : model["gguf"].items()) {
      if (!g.value("committed", false) || !g.contains("llama_cpp_reference")) continue;
      const std::string file = g["file"];
      const NpyArray hf = read_npy_f32(kDir + g["reference"].get<std::string>());
      const NpyArray llama = read_npy_f32(kDir + g["llama_cpp_reference"].get<std::string>());
      const size_t rows = llama.shape[0], vocab = llama.shape[1];
      const auto ours = run_prefix(file, ids, rows, arch::DeltaNetMode::kAuto, backend);
      const RowStats s = compare_rows(ours, hf, rows, vocab);
      const RowStats t = compare_rows(llama.data, hf, rows, vocab);
      std::printf(
          "[parity] %s %s backend vs transformers: rel L2 %.3g top-1 %d/%d; llama.cpp "
          "rel L2 %.3g top-1 %d/%d\n",
          file.c_str(), backend.c_str(), s.total_rel_l2, s.argmax_agree, s.rows, t.total_rel_l2, t.argmax_agree,
          t.rows);
      const double slack = file.find("qwen35moe") != std::string::npos ? 1.25 : 1.1;
      EXPECT_LE(s.total_rel_l2, t.total_rel_l2 * slack + 1e-3) << file;
      EXPECT_GE(s.argmax_agree, t.argmax_agree - 1) << file;
      ++checked;
    }
  }
  EXPECT_GE(checked, 3);
}

TEST(Parity, CpuBackendIsAsCloseToTransformersAsLlamaCpp) {
  expect_as_close_to_transformers_as_llama_cpp("cpu");
}

// The cuda backend's quantised matmuls also run on 8-bit activations: the same bound.
TEST(Parity, CudaBackendIsAsCloseToTransformersAsLlamaCpp) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_as_close_to_transformers_as_llama_cpp("cuda");
}

// Per-file ceiling on the relative L2 to llama.cpp, measured with margin (docs/parity.md).
double llama_cpp_bound(const std::string& file) {
  if (file.find("qwen35moe") != std::string::npos) return 0.2;  // routing flips at near-tie routers
  return 0.05;
}

// Against llama.cpp on the same file. llama.cpp quantises activations to 8 bits for its quantised
// matmuls; on these random-init models that alone moves its logits 2-12% (rel L2) away from
// transformers on the same weights and flips near-tie argmaxes (docs/parity.md). So the test
// states two things: (1) our distance to llama.cpp is no more than transformers' own distance to
// llama.cpp (+1%), i.e. the whole gap is llama.cpp's; (2) per-file bounds measured with margin.
TEST(Parity, MatchesLlamaCppAsCloselyAsTransformersDoes) {
  const auto m = manifest();
  const std::vector<int32_t> ids = m["prompt"]["ids"].get<std::vector<int32_t>>();
  int checked = 0;
  for (const auto& [name, model] : m["models"].items()) {
    for (const auto& [type, g] : model["gguf"].items()) {
      if (!g.value("committed", false) || !g.contains("llama_cpp_reference")) continue;
      const std::string file = g["file"];
      const NpyArray llama = read_npy_f32(kDir + g["llama_cpp_reference"].get<std::string>());
      const NpyArray hf = read_npy_f32(kDir + g["reference"].get<std::string>());
      const size_t rows = llama.shape[0], vocab = llama.shape[1];
      const auto ours = run_prefix(file, ids, rows, arch::DeltaNetMode::kAuto);
      const RowStats s = compare_rows(ours, llama, rows, vocab);
      const std::vector<float> hf_rows(hf.data.begin(), hf.data.begin() + rows * vocab);
      const RowStats t = compare_rows(hf_rows, llama, rows, vocab);
      std::printf(
          "[parity] %s vs llama.cpp: ours rel L2 %.3g top-1 %d/%d; transformers rel L2 %.3g "
          "top-1 %d/%d\n",
          file.c_str(), s.total_rel_l2, s.argmax_agree, s.rows, t.total_rel_l2, t.argmax_agree,
          t.rows);
      EXPECT_LE(s.total_rel_l2, t.total_rel_l2 * 1.01 + 1e-4) << file;
      EXPECT_GE(s.argmax_agree, t.argmax_agree - 1) << file;
      EXPECT_LT(s.total_rel_l2, llama_cpp_bound(file)) << file;
      ++checked;
    }
  }
  EXPECT_GE(checked, 3);
}

}  // namespace
}  // namespace qwenrt
