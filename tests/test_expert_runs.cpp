// The streamed cuda MoE block's runs (ops/cuda/expert_runs.h, host code): rows go together while
// their distinct experts fit the pool; a row that alone exceeds it, or an id out of range, fails.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "ops/cuda/expert_runs.h"

namespace qwenrt {
namespace {

using ops::cuda::next_expert_run;

TEST(ExpertRuns, RowsGoTogetherWhileTheirExpertsFit) {
  // 4 rows of k = 2 over 8 experts: {0,1} {1,2} {3,4} {0,1}.
  const std::vector<int32_t> ids = {0, 1, 1, 2, 3, 4, 0, 1};
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 8, 0), 4);  // 5 distinct: all rows
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 5, 0), 4);  // exactly 5
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 4, 0), 2);  // {0,1,2} then {3,4} would be 5
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 2, 0), 1);
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 4, 2), 2);  // {3,4,0,1}
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 3, 2), 1);
  EXPECT_EQ(next_expert_run(ids.data(), 4, 2, 8, 2, 3), 1);  // the last row alone
}

TEST(ExpertRuns, RepeatedExpertsCountOnce) {
  // Row 1 repeats row 0's experts in another order; row 2 repeats one id within the row.
  const std::vector<int32_t> ids = {5, 6, 6, 5, 7, 7};
  EXPECT_EQ(next_expert_run(ids.data(), 3, 2, 8, 2, 0), 2);
  EXPECT_EQ(next_expert_run(ids.data(), 3, 2, 8, 3, 0), 3);
  EXPECT_EQ(next_expert_run(ids.data(), 3, 2, 8, 1, 2), 1);
}

// -1: a row the routing sent nowhere (a NaN logit); it takes no slot.
TEST(ExpertRuns, RowsRoutedNowhereTakeNoSlot) {
  const std::vector<int32_t> ids = {-1, -1, 0, 1, -1, -1};
  EXPECT_EQ(next_expert_run(ids.data(), 3, 2, 4, 2, 0), 3);
  EXPECT_EQ(next_expert_run(ids.data(), 3, 2, 4, 1, 0), 1);  // {0, 1} do not fit one slot
}

TEST(ExpertRuns, ImpossibleRowsFail) {
  const std::vector<int32_t> ids = {0, 1, 2};
  EXPECT_THROW(next_expert_run(ids.data(), 1, 3, 4, 2, 0), Error);  // 3 experts, 2 slots
  const std::vector<int32_t> bad = {0, 9};
  EXPECT_THROW(next_expert_run(bad.data(), 1, 2, 4, 4, 0), Error);  // id 9 of 4 experts
  const std::vector<int32_t> negative = {-2, 0};
  EXPECT_THROW(next_expert_run(negative.data(), 1, 2, 4, 4, 0), Error);
}

}  // namespace
}  // namespace qwenrt
