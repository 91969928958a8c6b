// The expert cache's budget when --expert-cache is not given, on a backend whose weights go to
// device memory (Engine::setup_expert_streaming): nothing streams while the file and the reserve
// (the KV pool, 3 GiB for state and activations) fit the free device memory; otherwise the
// experts get what the trunk and the reserve leave, and never less than four tokens' experts.
// The backend here is a host backend that says it is "cuda" and reports a chosen free memory
// (the engine's arithmetic, no GPU).
#include <gtest/gtest.h>

#include <optional>

#include "core/error.h"
#include "core/weight.h"
#include "engine/engine.h"
#include "gguf/reader.h"
#include "ops/host_ops.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

class DeviceLikeOps final : public ops::HostOps {
 public:
  DeviceLikeOps(int64_t free, std::optional<ops::ExpertStreaming>* seen)
      : free_(free), seen_(seen) {}
  const char* name() const override { return "cuda"; }
  int64_t device_memory_free() const override { return free_; }
  void stream_experts(const ops::ExpertStreaming& c) override { *seen_ = c; }
  // Loading places weights and allocates state; no step runs.
  float* alloc(int64_t) override { fail("not used"); }
  void reset_workspace() override {}
  void embed(const Weight&, float*) override { fail("not used"); }
  void matmul(const Weight&, const float*, float*, int64_t) override { fail("not used"); }
  void rmsnorm(const float*, const Weight&, float*, int64_t, int64_t, float) override {
    fail("not used");
  }
  void rope_neox(float*, int, int, int64_t, int, float) override { fail("not used"); }
  void silu_mul(const float*, const float*, float*, int64_t) override { fail("not used"); }
  void add(const float*, const float*, float*, int64_t) override { fail("not used"); }
  void sigmoid_mul(const float*, const float*, int64_t, float*, int64_t, int64_t) override {
    fail("not used");
  }
  void attention(const ops::AttentionArgs&) override { fail("not used"); }
  void deltanet(const ops::DeltaNetArgs&) override { fail("not used"); }
  void moe(const ops::MoeWeights&, const float*, float*, int64_t, int, int) override {
    fail("not used");
  }
  void sample(const float*, int64_t, const ops::SamplingRow*, int, ops::SampledToken*) override {
    fail("not used");
  }

 private:
  int64_t free_;
  std::optional<ops::ExpertStreaming>* seen_;
};

struct Loaded {
  std::optional<ops::ExpertStreaming> streaming;
  int n_expert_used = 0;
};

Loaded load_with_free(const std::string& path, int64_t free) {
  Loaded l;
  engine::EngineOptions o;
  o.n_ctx = 256;
  o.cache_kv_bytes = 0;
  o.make_backend = [&] { return std::make_unique<DeviceLikeOps>(free, &l.streaming); };
  auto e = engine::Engine::load(path, o);
  l.n_expert_used = e->config().n_expert_used;
  return l;
}

TEST(ExpertBudget, DeviceMemoryDecidesWhetherAndHowMuchToStream) {
  const std::string path =
      testing_support::write_tiny(model::Arch::kQwen35Moe, "expert_budget_moe.gguf");
  gguf::File f = gguf::File::open(path).value();
  const auto file_bytes = static_cast<int64_t>(f.file_size());
  int64_t experts = 0;
  for (const auto& t : f.tensors()) experts += is_routed_expert_tensor(t.name) ? t.n_bytes : 0;
  ASSERT_GT(experts, 0);
  const int64_t others = file_bytes - experts;
  constexpr int64_t kGiB = int64_t{1} << 30;

  // Plenty of room: every weight is uploaded.
  EXPECT_FALSE(load_with_free(path, file_bytes + 8 * kGiB).streaming.has_value());

  // The file fits, the reserve beside it does not: the experts get the free memory less the
  // trunk, the 3 GiB and the slot's own KV pages (a few KiB on this file).
  const Loaded tight = load_with_free(path, file_bytes + 3 * kGiB);
  ASSERT_TRUE(tight.streaming.has_value());
  EXPECT_LT(tight.streaming->budget_bytes, experts);
  EXPECT_GT(tight.streaming->budget_bytes, experts - (int64_t{1} << 20));
  EXPECT_EQ(tight.streaming->min_slots, tight.n_expert_used);
  ASSERT_GT(tight.streaming->slot_bytes, 0);

  // Room for the trunk and the reserve only: four tokens' experts all the same (with a warning).
  const Loaded short_of = load_with_free(path, others + 3 * kGiB);
  ASSERT_TRUE(short_of.streaming.has_value());
  EXPECT_EQ(short_of.streaming->budget_bytes,
            int64_t{4} * short_of.n_expert_used * short_of.streaming->slot_bytes);

  // An explicit budget is taken as it is, whatever the free memory.
  {
    std::optional<ops::ExpertStreaming> seen;
    engine::EngineOptions o;
    o.n_ctx = 256;
    o.expert_cache_bytes = 12345678;
    o.make_backend = [&] { return std::make_unique<DeviceLikeOps>(file_bytes * 100, &seen); };
    engine::Engine::load(path, o);
    ASSERT_TRUE(seen.has_value());
    EXPECT_EQ(seen->budget_bytes, 12345678);
  }
}

}  // namespace
}  // namespace qwenrt
