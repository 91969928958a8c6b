// Routed experts streamed into device memory on the cuda backend (ops/cuda/expert_stream.h,
// --expert-cache): the logits equal those with every expert resident, bit for bit, at pools of
// one token's experts (a run of rows a token, slots evicted all the time; misses from the pinned
// host copy and, with it off, from the file), one more and all of them; the counters add up; a
// budget below one token's experts is refused naming the sizes. Both sides run with
// QWENRT_CUDA_MOE_ROW=0 (the one-row MoE launch, resident only, is another kernel). Skipped without
// a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "support/engine_steps.h"
#include "support/model_files.h"
#include "support/qwen4exp_fixture.h"

namespace qwenrt {
namespace {

// Prefill of 24 tokens, then 8 decode steps; every step's logits.
// host_copy false: misses read from the file through the stages, never the pinned host copy.
std::vector<float> run(const std::string& path, int64_t cache_bytes, ops::ExpertStats* stats,
                       bool host_copy = true) {
  setenv("QWENRT_CUDA_MOE_ROW", "0", 1);
  if (!host_copy) setenv("QWENRT_CUDA_EXPERT_HOST", "0", 1);
  engine::EngineOptions o;
  o.backend = "cuda";
  o.n_ctx = 256;
  o.expert_cache_bytes = cache_bytes;
  auto e = engine::Engine::load(path, o);
  unsetenv("QWENRT_CUDA_MOE_ROW");
  unsetenv("QWENRT_CUDA_EXPERT_HOST");
  const auto all = testing_support::prefill_then_decode(
      *e, testing_support::random_tokens(32, e->config().n_vocab, 5), 24);
  if (stats) *stats = e->backend().expert_stats();
  return all;
}

// One expert of the largest layer: in device memory (each tensor as placement holds it: F32 for
// types without a kernel, 64-byte aligned); and the least and most one expert of a layer reads
// from the file (a Q4_K_M file's layers mix types).
struct SlotBytes {
  int64_t device = 0, file = 0, file_min = 0;
};
SlotBytes slot_bytes(const std::string& path) {
  gguf::File f = gguf::File::open(path).value();
  std::vector<SlotBytes> layers;
  for (const auto& t : f.tensors()) {
    if (!is_routed_expert_tensor(t.name)) continue;
    const int il = std::stoi(t.name.substr(4));
    if (static_cast<int>(layers.size()) <= il) layers.resize(il + 1);
    const int64_t file = static_cast<int64_t>(t.n_bytes) / t.ne[2];
    const int64_t device = ops::cuda::has_kernel(t.dtype) ? file : t.ne[0] * t.ne[1] * 4;
    layers[il].device += (device + 63) / 64 * 64;
    layers[il].file += file;
  }
  SlotBytes s;
  s.file_min = INT64_MAX;
  for (const SlotBytes& l : layers) {
    if (l.file == 0) continue;
    s.device = std::max(s.device, l.device);
    s.file = std::max(s.file, l.file);
    s.file_min = std::min(s.file_min, l.file);
  }
  return s;
}

void expect_streamed_equals_resident(const std::string& path) {
  const auto cfg = engine::Engine::load(path, {.backend = "ref"})->config();
  const SlotBytes slot = slot_bytes(path);
  ASSERT_GT(slot.device, 0);
  const auto resident = run(path, 0, nullptr);
  // (The smallest pool twice: misses from the pinned host copy, and from the file.)
  const int k = cfg.n_expert_used;
  for (auto [slots, host_copy] : {std::pair{k, true}, std::pair{k, false}, std::pair{k + 1, true},
                                  std::pair{cfg.n_expert * cfg.n_layer, true}}) {
    ops::ExpertStats st;
    const auto streamed = run(path, slots * slot.device, &st, host_copy);
    ASSERT_EQ(streamed.size(), resident.size());
    size_t differ = 0;
    for (size_t i = 0; i < streamed.size(); ++i) differ += streamed[i] != resident[i];
    EXPECT_EQ(differ, 0u) << slots << " slots" << (host_copy ? "" : ", no host copy") << ": "
                          << differ << " of " << streamed.size() << " logits differ";
    EXPECT_EQ(st.capacity, slots);
    EXPECT_GT(st.lookups, 0);
    EXPECT_LE(st.hits, st.lookups);
    EXPECT_EQ(st.loads, st.lookups - st.hits);
    EXPECT_GE(st.bytes_read, st.loads * slot.file_min);
    EXPECT_LE(st.bytes_read, st.loads * slot.file);
    if (slots == cfg.n_expert * cfg.n_layer) {
      // Room for every expert: each is read once at most.
      EXPECT_LE(st.loads, cfg.n_expert * cfg.n_layer);
      EXPECT_GT(st.hits, 0);
    } else {
      EXPECT_GT(st.loads, slots);  // the pool was refilled
    }
  }
}

TEST(CudaExpertStream, TinyMoeStreamedEqualsResidentBitForBit) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  // (head_dim 64: the cuda attention's smallest.)
  expect_streamed_equals_resident(
      testing_support::write_tiny(model::Arch::kQwen35Moe, "cuda_stream_moe.gguf",
                                  [](model::SynthSpec& s) { s.config.head_dim = 64; }));
}

// Q4_K_M: Q4_K / Q6_K experts with a kernel, some layers' Q5_0 ones dequantised to F32 in the slot.
TEST(CudaExpertStream, TrainedQ4KMStreamedEqualsResidentBitForBit) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_streamed_equals_resident(QWENRT_SOURCE_DIR "/models/qwen35moe-chat-tiny.Q4_K_M.gguf");
}

TEST(CudaExpertStream, Qwen4expStreamedEqualsResidentBitForBit) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_streamed_equals_resident(testing_support::qwen4exp_file());
}

TEST(CudaExpertStream, BudgetBelowOneTokenIsRefused) {
  if (!ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string path =
      testing_support::write_tiny(model::Arch::kQwen35Moe, "cuda_stream_small.gguf",
                                  [](model::SynthSpec& s) { s.config.head_dim = 64; });
  const auto cfg = engine::Engine::load(path, {.backend = "ref"})->config();
  try {
    run(path, (cfg.n_expert_used - 1) * slot_bytes(path).device, nullptr);
    ADD_FAILURE() << "a budget below one token's experts should be refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda expert cache"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("one token needs {}", cfg.n_expert_used)), std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace qwenrt
