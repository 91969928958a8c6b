#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <vector>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

TEST(Checked, DetectsOverflow) {
  EXPECT_EQ(checked_mul(1ull << 31, 1ull << 32), std::optional<uint64_t>(1ull << 63));
  EXPECT_FALSE(checked_mul(1ull << 32, 1ull << 32));
  EXPECT_FALSE(checked_add(~0ull, 1));
  EXPECT_EQ(checked_align_up(33, 32), std::optional<uint64_t>(64));
  EXPECT_EQ(checked_align_up(64, 32), std::optional<uint64_t>(64));
  EXPECT_FALSE(checked_align_up(~0ull - 3, 32));
}

TEST(Expected, HoldsValueOrError) {
  Expected<int> good(5);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 5);
  auto bad = catch_error([]() -> int { fail("field '{}': expected {}, got {}", "x", 1, 2); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "field 'x': expected 1, got 2");
  EXPECT_THROW(bad.value(), Error);
}

TEST(DType, TableMatchesGgml) {
  EXPECT_EQ(traits(DType::Q4_K).block_bytes, 144u);
  EXPECT_EQ(traits(DType::Q6_K).block_bytes, 210u);
  EXPECT_EQ(traits(DType::IQ4_XS).block_bytes, 136u);
  EXPECT_EQ(traits(DType::Q8_0).block_elems, 32u);
  EXPECT_FALSE(dtype_traits(4));  // retired Q4_2
  EXPECT_EQ(dtype_name(77), "unknown type 77");
  EXPECT_EQ(dtype_from_name("q5_k"), std::optional<DType>(DType::Q5_K));
  EXPECT_FALSE(dtype_from_name("Q9_K"));
}

TEST(TensorView, ContiguousStrides) {
  std::vector<uint8_t> buf(3 * 2 * 144);
  auto v = TensorView::contiguous(DType::Q4_K, 3, {512, 3, 1, 1}, buf.data());
  EXPECT_EQ(v.row_bytes(), 2 * 144);
  EXPECT_EQ(v.nb[1], 2 * 144);
  EXPECT_EQ(v.row(2), buf.data() + 4 * 144);
  EXPECT_EQ(v.n_elements(), 512 * 3);
}

TEST(MappedFile, MapsBytesAndNamesMissingFiles) {
  const std::string path = testing_support::temp_path("mapped_file_test.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello";
  }
  MappedFile f = MappedFile::open(path);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), 5), "hello");
  MappedFile moved = std::move(f);
  EXPECT_EQ(moved.bytes()[4], 'o');
  std::remove(path.c_str());
  try {
    MappedFile::open(path);
    FAIL() << "opening a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(ThreadPool, CoversRangeOnceAndPropagatesErrors) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
  EXPECT_THROW(pool.parallel_for(100,
                                 [](int64_t b, int64_t) {
                                   if (b > 0) fail("chunk {}", b);
                                 }),
               Error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

}  // namespace
}  // namespace qwenrt
