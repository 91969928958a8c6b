// Speculative checks through the seam: a step that feeds a slot k + 1 rows with keep_states set,
// then Engine::rollback to any prefix of them, leaves the slot exactly as if only that prefix had
// been fed (KV truncated by length, recurrent state from the kept history), on every backend.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

using engine::Batch;
using engine::Engine;
using engine::EngineOptions;
using testing_support::random_tokens;
using testing_support::rel_l2;

struct VerifyCase {
  model::Arch arch;
  const char* backend;
};

std::string case_name(const ::testing::TestParamInfo<VerifyCase>& info) {
  return std::string(info.param.arch == model::Arch::kQwen35 ? "dense_" : "moe_") +
         info.param.backend;
}

class VerifyTest : public ::testing::TestWithParam<VerifyCase> {
 protected:
  void SetUp() override {
    if (backend() == "cuda" && !ops::cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  std::string backend() const { return GetParam().backend; }
  std::string path() const {
    const bool dense = GetParam().arch == model::Arch::kQwen35;
    if (backend() == "cuda") {  // the cuda attention kernels take head_dim 64, 128 or 256
      return testing_support::write_tiny(GetParam().arch,
                                         dense ? "verify_dense_hd64.gguf" : "verify_moe_hd64.gguf",
                                         [](model::SynthSpec& s) { s.config.head_dim = 64; });
    }
    return testing_support::write_tiny(GetParam().arch,
                                       dense ? "verify_dense.gguf" : "verify_moe.gguf");
  }
  std::unique_ptr<Engine> load(int verify_rows) const {
    EngineOptions o;
    o.backend = backend();
    o.n_slots = 2;
    o.n_ctx = 256;
    o.verify_rows = verify_rows;
    return Engine::load(path(), o);
  }
  // The same tokens fed the plain way: a prefill, then one decode step per token; the logits of
  // the last.
  std::vector<float> plain(Engine& e, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& tokens) const {
    e.states().reset(0);
    Batch b;
    for (size_t i = 0; i < prompt.size(); ++i)
      b.add(0, prompt[i], static_cast<int32_t>(i), i + 1 == prompt.size());
    std::vector<float> logits = e.step(b);
    for (size_t i = 0; i < tokens.size(); ++i) {
      b.clear();
      b.add(0, tokens[i], static_cast<int32_t>(prompt.size() + i), true);
      logits = e.step(b);
    }
    return logits;
  }
  // Exact on the reference backend (the check's rows run the same scalar loops as single rows);
  // the fast backends' matmuls round differently for 7 rows than for 1.
  double tolerance() const { return backend() == "ref" ? 0.0 : 5e-2; }
};

TEST_P(VerifyTest, RollbackEqualsFeedingOnlyTheKeptRows) {
  constexpr int kDrafts = 6;
  auto e = load(kDrafts + 1);
  auto reference = load(0);
  const int32_t V = e->config().n_vocab;
  const auto prompt = random_tokens(37, V, 5);
  const auto other = random_tokens(20, V, 6);
  const auto check = random_tokens(kDrafts + 1, V, 7);  // the fed token, then the drafts
  const auto after = random_tokens(3, V, 8);            // decoded after the rollback
  for (int keep = 1; keep <= kDrafts + 1; ++keep) {
    SCOPED_TRACE("rows kept " + std::to_string(keep));
    e->states().reset(0);
    e->states().reset(1);
    Batch b;
    for (size_t i = 0; i < prompt.size(); ++i) b.add(0, prompt[i], static_cast<int32_t>(i), false);
    for (size_t i = 0; i < other.size(); ++i) b.add(1, other[i], static_cast<int32_t>(i), false);
    e->step(b);
    // The check, beside a plain decode row of the other slot.
    b.clear();
    for (int i = 0; i <= kDrafts; ++i)
      b.add(0, check[i], static_cast<int32_t>(prompt.size() + i), true);
    b.add(1, after[0], static_cast<int32_t>(other.size()), true);
    b.keep_states.push_back(0);
    const auto checked = e->step(b);
    e->rollback(0, static_cast<int64_t>(prompt.size()) + keep);
    EXPECT_EQ(e->states().n_tokens(0), static_cast<int64_t>(prompt.size()) + keep);
    // Decoding goes on from the kept rows.
    std::vector<float> got;
    for (size_t i = 0; i < after.size(); ++i) {
      b.clear();
      b.add(0, after[i], static_cast<int32_t>(prompt.size() + keep + i), true);
      got = e->step(b);
    }
    std::vector<int32_t> fed(check.begin(), check.begin() + keep);
    fed.insert(fed.end(), after.begin(), after.end());
    const auto want = plain(*reference, prompt, fed);
    const double err = rel_l2(got, want);
    if (tolerance() == 0.0) {
      EXPECT_EQ(got, want) << "rel L2 " << err;
    } else {
      EXPECT_LT(err, tolerance());
    }
    // The check's own rows equal plain decoding too (row i saw rows 0..i).
    std::vector<float> row0(checked.begin(), checked.begin() + V);
    const auto want0 = plain(*reference, prompt, {check[0]});
    if (tolerance() == 0.0) {
      EXPECT_EQ(row0, want0);
    } else {
      EXPECT_LT(rel_l2(row0, want0), tolerance());
    }
    // Control: one more row kept than asked gives other logits (the comparison can fail).
    if (keep <= kDrafts) {
      std::vector<int32_t> longer(check.begin(), check.begin() + keep + 1);
      longer.insert(longer.end(), after.begin(), after.end());
      EXPECT_GT(rel_l2(plain(*reference, prompt, longer), want), 10 * tolerance() + 1e-3);
    }
  }
}

TEST_P(VerifyTest, TwoChecksInARowAcrossAPage) {
  auto e = load(4);
  auto reference = load(0);
  const int32_t V = e->config().n_vocab;
  const auto prompt = random_tokens(70, V, 9);  // past a KV page: the check crosses page 2
  const auto c1 = random_tokens(4, V, 10), c2 = random_tokens(4, V, 11);
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(0, prompt[i], static_cast<int32_t>(i), false);
  e->step(b);
  int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> fed;
  for (const auto* c : {&c1, &c2}) {
    b.clear();
    for (size_t i = 0; i < c->size(); ++i) b.add(0, (*c)[i], static_cast<int32_t>(n + i), true);
    b.keep_states.push_back(0);
    e->step(b);
    e->rollback(0, n + 2);
    fed.insert(fed.end(), c->begin(), c->begin() + 2);
    n += 2;
  }
  b.clear();
  b.add(0, 5, static_cast<int32_t>(n), true);
  const auto got = e->step(b);
  fed.push_back(5);
  const auto want = plain(*reference, prompt, fed);
  if (tolerance() == 0.0) {
    EXPECT_EQ(got, want);
  } else {
    EXPECT_LT(rel_l2(got, want), tolerance());
  }
}

TEST_P(VerifyTest, BadRollbacksAreErrors) {
  auto e = load(3);
  const int32_t V = e->config().n_vocab;
  const auto prompt = random_tokens(10, V, 12);
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(0, prompt[i], static_cast<int32_t>(i), false);
  e->step(b);
  EXPECT_THROW(e->rollback(0, 10), Error);  // the last step kept nothing
  b.clear();
  for (int i = 0; i < 4; ++i) b.add(0, 1 + i, 10 + i, true);
  b.keep_states.push_back(0);
  EXPECT_THROW(e->step(b), Error);  // 4 rows, the engine keeps states for 3
  e->states().reset(0);
  b.clear();
  for (size_t i = 0; i < prompt.size(); ++i) b.add(0, prompt[i], static_cast<int32_t>(i), false);
  e->step(b);
  b.clear();
  for (int i = 0; i < 3; ++i) b.add(0, 1 + i, 10 + i, true);
  b.keep_states.push_back(0);
  b.keep_states.push_back(1);  // slot 1 has no rows
  EXPECT_THROW(e->step(b), Error);
  b.keep_states.pop_back();
  e->step(b);
  EXPECT_THROW(e->rollback(0, 10), Error);  // before the check's first row
  EXPECT_THROW(e->rollback(0, 14), Error);  // past its last
  EXPECT_THROW(e->rollback(1, 11), Error);  // another slot
  e->rollback(0, 11);
  EXPECT_THROW(e->rollback(0, 11), Error);  // once
}

INSTANTIATE_TEST_SUITE_P(Backends, VerifyTest,
                         ::testing::Values(VerifyCase{model::Arch::kQwen35, "ref"},
                                           VerifyCase{model::Arch::kQwen35Moe, "ref"},
                                           VerifyCase{model::Arch::kQwen35, "cpu"},
                                           VerifyCase{model::Arch::kQwen35Moe, "cpu"},
                                           VerifyCase{model::Arch::kQwen35, "cuda"},
                                           VerifyCase{model::Arch::kQwen35Moe, "cuda"}),
                         case_name);

}  // namespace
}  // namespace qwenrt
