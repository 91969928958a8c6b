// The L2 prefetch schedule of the cuda backend (ops/cuda/prefetch_schedule.h): host logic only.
#include "ops/cuda/prefetch_schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace qwenrt::ops::cuda {
namespace {

using Range = PrefetchSchedule::Range;

// Distinct fake weight addresses.
const char kWeights[8][64] = {};
const void* w(int i) {
  return kWeights[i];
}

std::vector<Range> read(PrefetchSchedule& s, std::vector<Range> ranges) {
  return s.read(ranges);
}

TEST(PrefetchSchedule, LearnsTheStepOrderAndWrapsAround) {
  PrefetchSchedule s(1, 1 << 20);
  // Step 1: nothing known yet.
  EXPECT_TRUE(read(s, {{w(0), 100}}).empty());
  EXPECT_TRUE(read(s, {{w(1), 200}, {w(2), 300}}).empty());  // a group of two projections
  EXPECT_TRUE(read(s, {{w(3), 400}}).empty());
  // Step 2: each event prefetches the one that followed it; the last the first.
  std::vector<Range> p = read(s, {{w(0), 100}});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].p, w(1));
  EXPECT_EQ(p[0].bytes, 200);
  EXPECT_EQ(p[1].p, w(2));
  EXPECT_EQ(p[1].bytes, 300);
  p = read(s, {{w(1), 200}, {w(2), 300}});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].p, w(3));
  p = read(s, {{w(3), 400}});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].p, w(0));
  EXPECT_EQ(p[0].bytes, 100);
}

TEST(PrefetchSchedule, LeadAndBudget) {
  PrefetchSchedule s(2, 450);
  for (int step = 0; step < 2; ++step) {
    read(s, {{w(0), 100}});
    read(s, {{w(1), 200}});
    read(s, {{w(2), 300}});
  }
  // After w(0): w(1) whole, then w(2) cut at the budget (450 - 200).
  const std::vector<Range> p = read(s, {{w(0), 100}});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].p, w(1));
  EXPECT_EQ(p[0].bytes, 200);
  EXPECT_EQ(p[1].p, w(2));
  EXPECT_EQ(p[1].bytes, 250);
}

TEST(PrefetchSchedule, RelearnsAChangedOrderAndNeverPrefetchesItself) {
  PrefetchSchedule s(3, 1 << 20);
  read(s, {{w(0), 10}});
  read(s, {{w(1), 10}});
  read(s, {{w(0), 10}});  // w(0) follows w(1); w(1) follows w(0): a cycle of two
  std::vector<Range> p = read(s, {{w(1), 10}});
  // Lead 3, but the walk stops where it comes back to the event itself.
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].p, w(0));
  // A new order: w(1) -> w(4) now.
  read(s, {{w(4), 10}});
  p = read(s, {{w(1), 10}});
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p[0].p, w(4));
  // Forgetting: nothing to prefetch until an order is seen again.
  s.clear();
  EXPECT_TRUE(read(s, {{w(4), 10}}).empty());
  EXPECT_TRUE(read(s, {{w(1), 10}}).empty());
}

TEST(PrefetchSchedule, EmptyAndNullRangesAreIgnored) {
  PrefetchSchedule s(1, 1 << 20);
  EXPECT_TRUE(read(s, {}).empty());
  EXPECT_TRUE(read(s, {{nullptr, 10}}).empty());
  read(s, {{w(0), 10}});
  read(s, {{w(1), 0}, {w(2), 20}});
  const std::vector<Range> p = read(s, {{w(0), 10}});
  ASSERT_EQ(p.size(), 1u);  // w(1)'s empty range dropped
  EXPECT_EQ(p[0].p, w(2));
}

}  // namespace
}  // namespace qwenrt::ops::cuda
