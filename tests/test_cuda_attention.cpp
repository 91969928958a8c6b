// The CUDA backend's attention (ops/cuda/attention.cu) against the reference backend's, through
// the public Ops interface: the same spans, page tables, pools and fresh random inputs on both,
// then the outputs compared (relative L2 and max-abs) and the KV pools compared bit for bit after
// the step (the appended rows, and nothing else touched). Pages are scattered through the pool
// out of order; pool rows no slot holds are NaN (a read past a span's causal window shows), and
// outputs start NaN (an unwritten element shows). Cases cross page, key-tile and split-chunk
// boundaries, mix decode rows with prefill spans, and run several steps on the same pools. Rows of
// spans that take the tensor-core prefill kernel (attention_prefill.cu, f16 inputs) are compared
// with its own tolerance; the split shape's rows, and every row with QWENRT_CUDA_FLASH_PREFILL=0
// (the fp32 tiles), with the fp32 one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/ops.h"
#include "support/model_files.h"
#include "support/scoped_env.h"

namespace qwenrt::ops {
namespace {

using testing_support::rel_l2;

// fp32 dot products and online softmax (the GPU) against double accumulation (ref): observed
// errors are ~1e-6 relative; a wrong key, chunk or head shows as >= 1e-3.
constexpr double kMaxRelL2 = 2e-5;
constexpr double kMaxAbs = 1e-4;
// The tensor-core prefill rounds q, k, v and the probabilities to f16 (11 significant bits, unit
// roundoff u = 2^-11 = 4.9e-4), accumulating in fp32. An output o = sum_j p_j v_j / l moves by at
// most u sum_j p_j |v_j| <= u max|v| for the rounded v, and as much again for the rounded p: with
// |v| <= ~5.5 (the largest of ~1e7 N(0, 1) draws) that is 2 * 2.7e-3. Rounded q and k move a score
// by scale * sum_d q_d k_d (dq_d + dk_d): ~sqrt(2/3) u = 4e-4 rms, independent of D for unit
// inputs (~2.5e-3 at the tail of ~1e7 scores), which moves o by at most that times
// sum_j p_j |v_j - o| (a few units at worst). So 1e-2 bounds the worst element with some margin;
// in aggregate the rows should be ~3e-4 relative L2 (an estimate: not yet run on a GPU). A wrong
// key, head or causal boundary moves the rows that see few keys by O(1).
constexpr double kF16MaxRelL2 = 2e-3;
constexpr double kF16MaxAbs = 1e-2;
// Spans whose vectors of one KV head (count * n_head / n_head_kv) exceed this take the prefill
// kernel; the others the split shape (attention.cu's kTileVectors).
constexpr int kSplitVectors = 16;

// Whether prefill spans run on the tensor-core kernel (attention.cu reads the same variable).
bool flash_prefill_enabled() {
  const char* v = std::getenv("QWENRT_CUDA_FLASH_PREFILL");
  return !(v && std::string(v) == "0");
}

// Outputs against ref's: every element written and finite, within the relative L2 and max-abs
// bounds.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double max_rel_l2,
                  double max_abs_bound, const char* what) {
  if (got.empty()) return;
  int64_t non_finite = 0;
  double max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++non_finite;
    } else {
      max_abs = std::max(max_abs, std::abs(double(got[i]) - want[i]));
    }
  }
  EXPECT_EQ(non_finite, 0) << what << ": unwritten or NaN output elements";
  EXPECT_LT(rel_l2(got, want), max_rel_l2) << what;
  EXPECT_LT(max_abs, max_abs_bound) << what;
}

struct HeadShape {
  const char* name;
  int n_head, n_head_kv, head_dim;
};
constexpr HeadShape kTiny{"tiny_4x2x64", 4, 2, 64};
constexpr HeadShape k35B{"a3b_16x2x256", 16, 2, 256};
constexpr HeadShape k27B{"dense_24x4x256", 24, 4, 256};
constexpr HeadShape kMid{"mid_8x2x128", 8, 2, 128};
constexpr HeadShape kMha{"mha_3x3x128", 3, 3, 128};  // G = 1

// One span of a step: `count` new rows for slot `slot`.
struct SpanRows {
  int slot, count;
};

// Both backends' KV pools for a set of slots, with the same page tables and contents.
class AttentionRig {
 public:
  // Slot i starts with initial_len[i] tokens of random K/V and can grow to capacity[i] tokens.
  AttentionRig(HeadShape shape, int page_size, const std::vector<int>& initial_len,
               const std::vector<int>& capacity, uint64_t seed)
      : shape_(shape),
        page_size_(page_size),
        kv_dim_(int64_t{shape.n_head_kv} * shape.head_dim),
        length_(initial_len),
        rng_(seed),
        cuda_(make_cuda_ops()),
        ref_(make_ref_ops()) {
    const int n_slots = static_cast<int>(initial_len.size());
    int max_pages = 0, total_pages = 0;
    for (int c : capacity) {
      const int pages = (c + page_size - 1) / page_size;
      max_pages = std::max(max_pages, pages);
      total_pages += pages;
    }
    stride_ = max_pages + 2;  // spare table entries: max_tokens is above every slot's length
    n_pages_ = total_pages * 2 + 3;
    std::vector<int32_t> order(n_pages_);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);  // pages scattered, out of token order
    tables_.assign(size_t(n_slots) * stride_, -1);
    int next = 0;
    for (int s = 0; s < n_slots; ++s) {
      for (int p = 0; p * page_size < capacity[s]; ++p)
        tables_[size_t(s) * stride_ + p] = order[next++];
    }
    const size_t pool_floats = size_t(n_pages_) * page_size * kv_dim_;
    k_host_.assign(pool_floats, NAN);
    v_host_.assign(pool_floats, NAN);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int s = 0; s < n_slots; ++s) {
      for (int t = 0; t < initial_len[s]; ++t) {
        const size_t at = row_offset(s, t);
        for (int64_t e = 0; e < kv_dim_; ++e) {
          k_host_[at + e] = nd(rng_);
          v_host_[at + e] = nd(rng_);
        }
      }
    }
    k_dev_ = static_cast<float*>(cuda_->alloc_buffer(int64_t(pool_floats) * 4));
    v_dev_ = static_cast<float*>(cuda_->alloc_buffer(int64_t(pool_floats) * 4));
    cuda_->upload(k_host_.data(), k_dev_, int64_t(pool_floats));
    cuda_->upload(v_host_.data(), v_dev_, int64_t(pool_floats));
  }
  ~AttentionRig() {
    cuda_->free_buffer(k_dev_);
    cuda_->free_buffer(v_dev_);
  }
  AttentionRig(const AttentionRig&) = delete;
  AttentionRig& operator=(const AttentionRig&) = delete;

  // One step: spans in the given order over rows [0, n), fresh q / k / v, both backends, compared.
  // q rows are q_pad floats longer than n_head * head_dim. `gated`: attention_gated with a fresh
  // output gate (rows 4 floats longer than the output's).
  void step(const std::vector<SpanRows>& rows, int q_pad, bool gated = false) {
    const int hd = shape_.head_dim;
    std::vector<Span> spans;
    std::vector<int32_t> positions;
    int n = 0;
    for (const SpanRows& r : rows) {
      spans.push_back({.slot = r.slot, .begin = n, .count = r.count, .n_past = length_[r.slot]});
      for (int i = 0; i < r.count; ++i) positions.push_back(length_[r.slot] + i);
      n += r.count;
    }
    std::vector<int32_t> tokens(n, 0), output_rows(n);
    std::iota(output_rows.begin(), output_rows.end(), 0);
    const StepLayout layout{.tokens = tokens.data(),
                            .positions = positions.data(),
                            .n = n,
                            .spans = spans.data(),
                            .n_spans = static_cast<int>(spans.size()),
                            .output_rows = output_rows.data(),
                            .n_output_rows = n,
                            .page_tables = tables_.data(),
                            .page_table_stride = stride_};

    const int64_t q_stride = int64_t{shape_.n_head} * hd + q_pad;
    const int64_t out_row = int64_t{shape_.n_head} * hd;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(size_t(n) * q_stride), k(size_t(n) * kv_dim_), v(size_t(n) * kv_dim_);
    for (auto& x : q) x = nd(rng_);
    for (auto& x : k) x = nd(rng_);
    for (auto& x : v) x = nd(rng_);
    const float scale = 1.0f / std::sqrt(float(hd));

    // The reference run on the host pools (attention_gated: ref's attention, then sigmoid_mul).
    std::vector<float> gate;
    const int64_t gate_stride = out_row + 4;
    if (gated) {
      gate.resize(size_t(n) * gate_stride);
      for (auto& x : gate) x = 2.0f * nd(rng_);
    }
    std::vector<float> want(size_t(n) * out_row, NAN);
    {
      const KvLayer kv{
          .k = k_host_.data(), .v = v_host_.data(), .page_size = page_size_, .kv_dim = kv_dim_};
      ref_->begin_step(layout);
      const AttentionArgs args{.q = q.data(),
                               .q_stride = q_stride,
                               .k = k.data(),
                               .v = v.data(),
                               .kv = kv,
                               .out = want.data(),
                               .n_head = shape_.n_head,
                               .n_head_kv = shape_.n_head_kv,
                               .head_dim = hd,
                               .scale = scale};
      if (gated) {
        ref_->attention_gated(args, gate.data(), gate_stride, n);
      } else {
        ref_->attention(args);
      }
    }

    // The GPU runs (outputs poisoned with NaN first): the op under test, and where the step is
    // gated, the same through the other paths, which must give the same bits: the split chunks
    // merged by their last block or by a combine launch (QWENRT_CUDA_ATTN_FOLD=0), the gate in
    // the merge or as sigmoid_mul after attention.
    enum class Path { kOp, kThenSigmoidMul, kCombineLaunch };
    auto run_cuda = [&](Path path) {
      const testing_support::ScopedEnv fold("QWENRT_CUDA_ATTN_FOLD",
                                            path == Path::kCombineLaunch ? "0" : "1");
      std::vector<float> out(size_t(n) * out_row, NAN);
      float* q_d = cuda_->alloc(int64_t(q.size()));
      float* k_d = cuda_->alloc(int64_t(k.size()));
      float* v_d = cuda_->alloc(int64_t(v.size()));
      float* out_d = cuda_->alloc(int64_t(out.size()));
      float* gate_d = gated ? cuda_->alloc(int64_t(gate.size())) : nullptr;
      cuda_->upload(q.data(), q_d, int64_t(q.size()));
      cuda_->upload(k.data(), k_d, int64_t(k.size()));
      cuda_->upload(v.data(), v_d, int64_t(v.size()));
      cuda_->upload(out.data(), out_d, int64_t(out.size()));
      if (gated) cuda_->upload(gate.data(), gate_d, int64_t(gate.size()));
      const KvLayer kv{.k = k_dev_, .v = v_dev_, .page_size = page_size_, .kv_dim = kv_dim_};
      const AttentionArgs args{.q = q_d,
                               .q_stride = q_stride,
                               .k = k_d,
                               .v = v_d,
                               .kv = kv,
                               .out = out_d,
                               .n_head = shape_.n_head,
                               .n_head_kv = shape_.n_head_kv,
                               .head_dim = hd,
                               .scale = scale};
      cuda_->begin_step(layout);
      if (!gated) {
        cuda_->attention(args);
      } else if (path == Path::kThenSigmoidMul) {
        cuda_->attention(args);
        cuda_->sigmoid_mul(out_d, gate_d, gate_stride, out_d, n, out_row);
      } else {
        cuda_->attention_gated(args, gate_d, gate_stride, n);
      }
      cuda_->download(out_d, out.data(), int64_t(out.size()));
      cuda_->reset_workspace();
      return out;
    };
    const std::vector<float> got = run_cuda(Path::kOp);
    // Each path appends the same K/V rows again.
    EXPECT_EQ(differing_floats(run_cuda(Path::kCombineLaunch), got), 0)
        << "the combine launch's merge differs from the last chunk's";
    if (gated) {
      EXPECT_EQ(differing_floats(run_cuda(Path::kThenSigmoidMul), got), 0)
          << "attention then sigmoid_mul differs from attention_gated";
    }

    // Each span's rows with the tolerance of the kernel that computed them.
    const int group = shape_.n_head / shape_.n_head_kv;
    const bool flash = flash_prefill_enabled();
    std::vector<float> got_f32, want_f32, got_f16, want_f16;
    for (const Span& sp : spans) {
      const bool f16 = flash && sp.count * group > kSplitVectors;
      const size_t begin = size_t(sp.begin) * out_row, end = size_t(sp.begin + sp.count) * out_row;
      std::vector<float>& g = f16 ? got_f16 : got_f32;
      std::vector<float>& w = f16 ? want_f16 : want_f32;
      g.insert(g.end(), got.begin() + begin, got.begin() + end);
      w.insert(w.end(), want.begin() + begin, want.begin() + end);
    }
    expect_close(got_f32, want_f32, kMaxRelL2, kMaxAbs, "fp32 rows (split shape or fp32 tiles)");
    expect_close(got_f16, want_f16, kF16MaxRelL2, kF16MaxAbs, "f16 rows (tensor-core prefill)");

    // The pools after the step: the GPU's appended rows equal ref's, every other row unchanged.
    std::vector<float> k_after(k_host_.size()), v_after(v_host_.size());
    cuda_->download(k_dev_, k_after.data(), int64_t(k_after.size()));
    cuda_->download(v_dev_, v_after.data(), int64_t(v_after.size()));
    EXPECT_EQ(differing_rows(k_after, k_host_), 0) << "K pool rows differ from ref's";
    EXPECT_EQ(differing_rows(v_after, v_host_), 0) << "V pool rows differ from ref's";

    for (const SpanRows& r : rows) length_[r.slot] += r.count;
  }

 private:
  size_t row_offset(int slot, int t) const {
    const int32_t page = tables_[size_t(slot) * stride_ + t / page_size_];
    return (size_t(page) * page_size_ + t % page_size_) * kv_dim_;
  }
  // Floats whose bits differ.
  static int64_t differing_floats(const std::vector<float>& a, const std::vector<float>& b) {
    const size_t common = std::min(a.size(), b.size());
    int64_t n = static_cast<int64_t>(std::max(a.size(), b.size()) - common);
    for (size_t i = 0; i < common; ++i) n += std::memcmp(&a[i], &b[i], 4) != 0 ? 1 : 0;
    return n;
  }
  // Pool rows whose bytes differ (NaN rows compare by their bits, so untouched ones match).
  int64_t differing_rows(const std::vector<float>& a, const std::vector<float>& b) const {
    int64_t rows = 0;
    for (size_t at = 0; at < a.size(); at += kv_dim_) {
      if (std::memcmp(a.data() + at, b.data() + at, kv_dim_ * 4) != 0) ++rows;
    }
    return rows;
  }

  HeadShape shape_;
  int page_size_;
  int64_t kv_dim_;
  std::vector<int> length_;
  std::mt19937_64 rng_;
  std::unique_ptr<Ops> cuda_, ref_;
  int64_t stride_ = 0;
  int n_pages_ = 0;
  std::vector<int32_t> tables_;
  std::vector<float> k_host_, v_host_;
  float* k_dev_ = nullptr;
  float* v_dev_ = nullptr;
};

// A one-step case: spans of (count, n_past), given to slots in reverse order (slot 0 unused).
struct StepCase {
  const char* name;
  std::vector<std::pair<int, int>> spans;  // count, n_past
  int page_size = 64;
  int q_pad = 8;
};

class CudaAttention : public ::testing::TestWithParam<std::tuple<HeadShape, StepCase>> {};

TEST_P(CudaAttention, MatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto& [shape, c] = GetParam();
  const int n_spans = static_cast<int>(c.spans.size());
  std::vector<int> initial(n_spans + 1, 0), capacity(n_spans + 1, 1);
  std::vector<SpanRows> rows;
  for (int i = 0; i < n_spans; ++i) {
    const int slot = n_spans - i;
    initial[slot] = c.spans[i].second;
    capacity[slot] = c.spans[i].first + c.spans[i].second;
    rows.push_back({slot, c.spans[i].first});
  }
  AttentionRig rig(shape, c.page_size, initial, capacity,
                   std::hash<std::string>{}(std::string(shape.name) + c.name));
  rig.step(rows, c.q_pad);
}

const StepCase kCases[] = {
    {"decode_at_0", {{1, 0}}},
    {"decode_at_1", {{1, 1}}},
    {"decode_at_63", {{1, 63}}},
    {"decode_at_64", {{1, 64}}},
    {"decode_at_700", {{1, 700}}},
    {"decode_at_5000", {{1, 5000}}},
    {"decode_3_slots", {{1, 40}, {1, 3000}, {1, 129}}},
    {"prefill_1_at_130", {{1, 130}}},
    {"prefill_63_at_0", {{63, 0}}},
    {"prefill_63_at_130", {{63, 130}}},
    {"prefill_200_at_0", {{200, 0}}},
    {"prefill_200_at_130", {{200, 130}}},
    {"prefill_17_with_2_decodes", {{1, 300}, {17, 45}, {1, 1000}}},
    {"short_spans_2_and_4", {{2, 500}, {4, 90}, {3, 0}}},  // split shape or tiles, by group
    {"page_16", {{1, 700}, {63, 130}, {2, 33}}, 16},
    {"unpadded_q", {{1, 70}, {20, 10}}, 64, 0},
    // Around the prefill kernel's 64-vector tiles and 32-key tiles, long spans, pages that do not
    // divide the spans, several prefill spans with decode rows between them.
    {"prefill_64_at_0", {{64, 0}}},
    {"prefill_65_at_0", {{65, 0}}},
    {"prefill_64_at_100_page_48", {{64, 100}}, 48},
    {"prefill_1000_at_0", {{1000, 0}}},
    {"prefill_1000_at_300_page_48", {{1000, 300}}, 48},
    {"prefills_with_decodes_page_48",
     {{1, 500}, {65, 0}, {130, 33}, {1, 7}, {64, 64}, {3, 10}, {1000, 17}},
     48},
};

INSTANTIATE_TEST_SUITE_P(Steps, CudaAttention,
                         ::testing::Combine(::testing::Values(kTiny, k35B, k27B, kMid, kMha),
                                            ::testing::ValuesIn(kCases)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::get<1>(info.param).name;
                         });

// The fp32 tiles kernel (QWENRT_CUDA_FLASH_PREFILL=0) still matches with the fp32 tolerance.
TEST(CudaAttentionFp32Tiles, MatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const testing_support::ScopedEnv fp32_tiles("QWENRT_CUDA_FLASH_PREFILL", "0");
  for (const HeadShape& shape : {kTiny, k27B, kMha}) {
    SCOPED_TRACE(shape.name);
    AttentionRig rig(shape, 48, {0, 500, 0, 33}, {65, 501, 200, 163}, 11);
    rig.step({{1, 1}, {2, 200}, {0, 65}, {3, 130}}, 8);
  }
}

// The attention with its output gate (attention_gated; the blocks' path): against ref's attention
// then sigmoid_mul, and bit for bit against the CUDA backend's own two ops and its combine launch
// (AttentionRig::step). Decode-shaped steps take the gate in the chunks' merge; a step with a
// prefill span runs the two ops.
TEST(CudaAttentionGated, MatchesReferenceAndTheTwoOps) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::vector<std::pair<int, int>>> cases = {
      {{1, 0}},
      {{1, 700}},
      {{1, 5000}},
      {{1, 40}, {1, 3000}, {1, 129}},
      {{2, 500}, {4, 90}, {3, 0}},  // short spans: split shape where count * G <= 16
      {{1, 300}, {17, 45}, {1, 1000}}};
  for (const HeadShape& shape : {kTiny, k35B, k27B, kMha}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(std::string(shape.name) + " case " + std::to_string(i));
      const int n_spans = static_cast<int>(cases[i].size());
      std::vector<int> initial(n_spans + 1, 0), capacity(n_spans + 1, 1);
      std::vector<SpanRows> rows;
      for (int j = 0; j < n_spans; ++j) {
        initial[j + 1] = cases[i][j].second;
        capacity[j + 1] = cases[i][j].first + cases[i][j].second;
        rows.push_back({j + 1, cases[i][j].first});
      }
      AttentionRig rig(shape, 64, initial, capacity, 100 + i);
      rig.step(rows, 8, /*gated=*/true);
    }
  }
}

// Several steps on the same pools: keys a step appended are read back from the pages by the next.
TEST(CudaAttentionSteps, LaterStepsReadAppendedKeys) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const HeadShape& shape : {kTiny, k35B, k27B}) {
    SCOPED_TRACE(shape.name);
    AttentionRig rig(shape, 64, {0, 200, 0}, {80, 300, 64}, 7);
    rig.step({{0, 63}, {1, 1}}, 8);          // a prefill and a decode row
    rig.step({{1, 1}, {0, 1}}, 8);           // both decode, slots out of order
    rig.step({{0, 3}, {1, 1}, {2, 40}}, 8);  // a short span, a decode row, a new slot's prefill
    rig.step({{2, 1}, {0, 1}, {1, 1}}, 8);
    rig.step({{1, 1}, {2, 1}}, 8, /*gated=*/true);
  }
  // The same through the prefill kernel's tiles: a second prefill over keys the first appended.
  for (const HeadShape& shape : {k27B, kMha}) {
    SCOPED_TRACE(shape.name);
    AttentionRig rig(shape, 48, {0, 0}, {300, 10}, 9);
    rig.step({{0, 130}, {1, 1}}, 8);
    rig.step({{0, 100}, {1, 1}}, 8);  // 130 keys from the pages, 100 from the step
    rig.step({{0, 1}}, 8);
  }
}

}  // namespace
}  // namespace qwenrt::ops
