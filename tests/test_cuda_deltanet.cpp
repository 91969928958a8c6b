// The CUDA DeltaNet block (ops/cuda/deltanet.cu through make_cuda_ops()->deltanet) against
// ref::deltanet_spans on the same inputs and the same random initial state: one decode row, three
// slots decoding out of order, prefill spans of 1 / 63 / 200 tokens, a 17-token span mixed with
// decode rows, a short span straddling the conv kernel's row tiles; D = 32 / 64 / 96 / 128 (state
// in registers) and 160 / 256 (state in memory); Hk != Hv, and 16 / 32 heads at D = 128. Compared:
// out, the conv state (a copy of inputs: exact), the delta state, the slots outside the step (bit
// for bit), then a second, decode step on each backend's own result (state continuity). Outputs
// start NaN so an unwritten element fails. The chunked form (spans 1 / 63 / 64 / 65 / 1000, several
// spans in a step, D = 64 / 128) runs on tensor cores (tf32 products: kTf32RelL2) and, with
// QWENRT_CUDA_CHUNKED_TC=0, in fp32 (1e-4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "ops/ref/kernels.h"
#include "support/model_files.h"
#include "support/op_data.h"

namespace qwenrt::ops {
namespace {

std::string sci(double x) {
  return fmt::format("{:.2e}", x);
}

using testing_support::rel_l2;

using testing_support::randn;

// One backend for every test of this file, never destroyed (see test_cuda_elementwise.cpp).
Ops& gpu() {
  static Ops* ops = make_cuda_ops().release();
  return *ops;
}

float* to_device(const std::vector<float>& host) {
  float* p = gpu().alloc(static_cast<int64_t>(host.size()));
  gpu().upload(host.data(), p, static_cast<int64_t>(host.size()));
  return p;
}
std::vector<float> to_host(const float* device, size_t n) {
  std::vector<float> host(n);
  gpu().download(device, host.data(), static_cast<int64_t>(n));
  return host;
}

Weight f32_weight(const char* name, const std::vector<float>& data, int64_t ne0, int64_t ne1 = 1) {
  return Weight{
      .name = name,
      .view = TensorView::contiguous(DType::F32, ne1 > 1 ? 2 : 1, {ne0, ne1, 1, 1}, data.data())};
}

constexpr int kConvK = 4;
constexpr float kEps = 1e-6f;
constexpr int kPageTableStride = 64;  // a dummy table: DeltaNet never reads it

// A step laid out as Engine::plan does: spans in row order, each slot's rows contiguous, the
// positions n_past.., the last row of each span an output row.
struct Step {
  std::vector<int32_t> tokens, positions, output_rows, page_tables;
  std::vector<Span> spans;
  StepLayout layout(DeltaNetMode mode) const {
    return {.tokens = tokens.data(),
            .positions = positions.data(),
            .n = static_cast<int64_t>(tokens.size()),
            .spans = spans.data(),
            .n_spans = static_cast<int>(spans.size()),
            .output_rows = output_rows.data(),
            .n_output_rows = static_cast<int64_t>(output_rows.size()),
            .page_tables = page_tables.data(),
            .page_table_stride = kPageTableStride,
            .deltanet_mode = mode};
  }
  int64_t n() const { return static_cast<int64_t>(tokens.size()); }
};

Step make_step(const std::vector<int>& counts, const std::vector<int>& slots,
               const std::vector<int>& n_past, int n_slots) {
  Step s;
  s.page_tables.assign(size_t(n_slots) * kPageTableStride, 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    const int32_t begin = static_cast<int32_t>(s.tokens.size());
    s.spans.push_back({.slot = slots[i], .begin = begin, .count = counts[i], .n_past = n_past[i]});
    for (int t = 0; t < counts[i]; ++t) {
      s.tokens.push_back(0);
      s.positions.push_back(n_past[i] + t);
    }
    s.output_rows.push_back(begin + counts[i] - 1);
  }
  return s;
}

// Which kernels run a case: the recurrent kernel (QWENRT_CUDA_CHUNKED=0), or the chunked form
// (the step's mode kChunked) on tensor cores (the default) or fp32 (QWENRT_CUDA_CHUNKED_TC=0).
enum class Form { kRecurrent, kChunkedFp32, kChunkedTc };

// Relative L2 bound of the tensor-core chunked form. Its products round their operands to tf32
// (10-bit mantissa, round to nearest: relative error at most u = 2^-11 = 4.9e-4, rms u / sqrt(3)
// = 2.8e-4 per operand), so one product of two rounded operands is off by ~4e-4 rms relative,
// and a dot product of such terms by about as much relative to its size (the errors have random
// signs). An output row passes through about three such products in series (k^ k^T into U and W
// by the forward substitution, W S into D, q^ S0 + A D into O) and the state through two (W S,
// the update), each error damped by the decays. A one-off host emulation of the chunked form with
// these roundings (fp32 otherwise) against a double recurrence, on inputs drawn as here,
// measured 2.7e-4
// .. 3.7e-4 (out and state; D 64 and 128; spans 1, 65, 1000): 2e-3 leaves a margin of 5x (not yet
// run on a GPU). A wrong fragment index, row, column tile or chunk boundary moves whole rows by
// O(1), far above it (one wrong row of the 1000 is already ~3e-2).
constexpr double kTf32RelL2 = 2e-3;

struct DeltaCase {
  std::string name;
  int hk, hv, d;
  std::vector<int> counts;  // span lengths of the first step
  std::vector<int> slots;   // their slots (the state pool holds max(slots) + 2, the last unused)
  bool fresh = false;       // start from zero state (a new sequence's prefill)
  Form form = Form::kRecurrent;
};

// The layer's weights and step inputs, on the host and as placed / uploaded on the GPU.
struct Layer {
  int hk, hv, d;
  int64_t nk, nv, C;
  std::vector<float> kernel, dt_bias, a, norm;
  Weight host_conv, host_dt_bias, host_a, host_norm;
  Weight gpu_conv, gpu_dt_bias, gpu_a, gpu_norm;

  Layer(int hk_, int hv_, int d_, std::mt19937_64& rng)
      : hk(hk_), hv(hv_), d(d_), nk(int64_t{hk_} * d_), nv(int64_t{hv_} * d_), C(2 * nk + nv) {
    kernel = randn(C * kConvK, rng, 0.5f);
    dt_bias = randn(hv, rng);
    a = randn(hv, rng, 0.5f);
    for (auto& x : a) x = -std::exp(x);  // ssm_a = -exp(A_log)
    norm = randn(d, rng);
    host_conv = f32_weight("blk.0.ssm_conv1d.weight", kernel, kConvK, C);
    host_dt_bias = f32_weight("blk.0.ssm_dt.bias", dt_bias, hv);
    host_a = f32_weight("blk.0.ssm_a", a, hv);
    host_norm = f32_weight("blk.0.ssm_norm.weight", norm, d);
    gpu_conv = gpu().place(host_conv);
    gpu_dt_bias = gpu().place(host_dt_bias);
    gpu_a = gpu().place(host_a);
    gpu_norm = gpu().place(host_norm);
  }

  // The GPU op's arguments: the step's inputs in device memory, a device state, out.
  DeltaNetArgs device_args(const float* qkv, const float* z, const float* alpha, const float* beta,
                           const RecurrentLayer& state, float* out) const {
    return {.qkv = qkv,
            .z = z,
            .alpha = alpha,
            .beta = beta,
            .conv = gpu_conv,
            .dt_bias = gpu_dt_bias,
            .a = gpu_a,
            .norm = gpu_norm,
            .state = state,
            .out = out,
            .n_k_heads = hk,
            .n_v_heads = hv,
            .head_dim = d,
            .eps = kEps};
  }
};

// The recurrent state of both backends: the ref's in host vectors, the GPU's in alloc_buffer
// buffers. Each step continues from its own backend's result (state continuity).
struct States {
  size_t conv_floats, delta_floats;
  std::vector<float> ref_conv, ref_delta;
  RecurrentLayer device{};

  States(const Layer& l, int n_slots, bool fresh, std::mt19937_64& rng)
      : conv_floats(size_t(n_slots) * (kConvK - 1) * l.C),
        delta_floats(size_t(n_slots) * l.hv * l.d * l.d) {
    ref_conv = fresh ? std::vector<float>(conv_floats, 0.0f) : randn(conv_floats, rng);
    ref_delta = fresh ? std::vector<float>(delta_floats, 0.0f) : randn(delta_floats, rng, 0.5f);
    device.conv = static_cast<float*>(gpu().alloc_buffer(int64_t(conv_floats) * 4));
    device.delta = static_cast<float*>(gpu().alloc_buffer(int64_t(delta_floats) * 4));
    if (!fresh) {  // fresh: alloc_buffer's zero fill is the initial state under test
      gpu().upload(ref_conv.data(), device.conv, int64_t(conv_floats));
      gpu().upload(ref_delta.data(), device.delta, int64_t(delta_floats));
    }
  }
  ~States() {
    gpu().free_buffer(device.conv);
    gpu().free_buffer(device.delta);
  }
  States(const States&) = delete;
  States& operator=(const States&) = delete;
};

bool in_step(const Step& step, int slot) {
  return std::any_of(step.spans.begin(), step.spans.end(),
                     [&](const Span& s) { return s.slot == slot; });
}

// One step on both backends from their current states, then the comparison.
void run_step(const Layer& l, const Step& step, States& st, std::mt19937_64& rng, const char* what,
              Form form) {
  const bool chunked = form != Form::kRecurrent;
  SCOPED_TRACE(what);
  Ops& ops = gpu();
  ops.reset_workspace();
  const int64_t n = step.n();
  const auto qkv = randn(n * l.C, rng), z = randn(n * l.nv, rng), alpha = randn(n * l.hv, rng),
             beta = randn(n * l.hv, rng);

  // The reference, in both modes: kRecurrent (the form the GPU runs) and kAuto (chunked for
  // spans of several tokens, equal within fp32 rounding). The recurrent result carries on.
  const std::vector<float> conv_before = st.ref_conv, delta_before = st.ref_delta;
  std::vector<float> want(n * l.nv, NAN), want_auto(n * l.nv, NAN);
  std::vector<float> auto_conv = st.ref_conv, auto_delta = st.ref_delta;
  {
    const RecurrentLayer state{.conv = st.ref_conv.data(), .delta = st.ref_delta.data()};
    ref::deltanet_spans(step.layout(DeltaNetMode::kRecurrent), {.qkv = qkv.data(),
                                                                .z = z.data(),
                                                                .alpha = alpha.data(),
                                                                .beta = beta.data(),
                                                                .conv = l.host_conv,
                                                                .dt_bias = l.host_dt_bias,
                                                                .a = l.host_a,
                                                                .norm = l.host_norm,
                                                                .state = state,
                                                                .out = want.data(),
                                                                .n_k_heads = l.hk,
                                                                .n_v_heads = l.hv,
                                                                .head_dim = l.d,
                                                                .eps = kEps});
    const RecurrentLayer state_auto{.conv = auto_conv.data(), .delta = auto_delta.data()};
    ref::deltanet_spans(step.layout(DeltaNetMode::kAuto), {.qkv = qkv.data(),
                                                           .z = z.data(),
                                                           .alpha = alpha.data(),
                                                           .beta = beta.data(),
                                                           .conv = l.host_conv,
                                                           .dt_bias = l.host_dt_bias,
                                                           .a = l.host_a,
                                                           .norm = l.host_norm,
                                                           .state = state_auto,
                                                           .out = want_auto.data(),
                                                           .n_k_heads = l.hk,
                                                           .n_v_heads = l.hv,
                                                           .head_dim = l.d,
                                                           .eps = kEps});
  }

  ops.begin_step(step.layout(chunked ? DeltaNetMode::kChunked : DeltaNetMode::kAuto));
  float* out = to_device(std::vector<float>(n * l.nv, NAN));
  ops.deltanet(l.device_args(to_device(qkv), to_device(z), to_device(alpha), to_device(beta),
                             st.device, out));
  const auto got = to_host(out, n * l.nv);
  const auto got_conv = to_host(st.device.conv, st.conv_floats);
  const auto got_delta = to_host(st.device.delta, st.delta_floats);

  // Tolerances (relative L2): fp32 state and fp32 dot products against ref's double sums with a
  // float state, the bound the CPU backend's kernels are held to (1e-5; a host emulation of these
  // kernels measured <= 3e-7); against the chunked ref (kAuto), whose rounding differs, 1e-4.
  // The fp32 chunked kernels round like the chunked ref: 1e-4 against both. The tensor-core form:
  // kTf32RelL2 against both.
  const double tol = form == Form::kChunkedTc ? kTf32RelL2 : chunked ? 1e-4 : 1e-5;
  const double tol_auto = form == Form::kChunkedTc ? kTf32RelL2 : 1e-4;
  const double eo = rel_l2(got, want), ed = rel_l2(got_delta, st.ref_delta);
  EXPECT_LT(eo, tol) << "out vs ref recurrent";
  EXPECT_LT(ed, tol) << "delta state vs ref recurrent";
  EXPECT_LT(rel_l2(got, want_auto), tol_auto) << "out vs ref auto";
  EXPECT_LT(rel_l2(got_delta, auto_delta), tol_auto) << "delta state vs ref auto";
  EXPECT_EQ(got_conv, st.ref_conv) << "conv state: the last K-1 inputs, copied";
  ::testing::Test::RecordProperty(what, sci(eo) + " / state " + sci(ed));

  // Slots outside the step keep their state bit for bit.
  const int n_slots = static_cast<int>(st.conv_floats / ((kConvK - 1) * l.C));
  const size_t conv_per_slot = st.conv_floats / n_slots, delta_per_slot = st.delta_floats / n_slots;
  for (int slot = 0; slot < n_slots; ++slot) {
    if (in_step(step, slot)) continue;
    EXPECT_TRUE(std::equal(got_conv.begin() + slot * conv_per_slot,
                           got_conv.begin() + (slot + 1) * conv_per_slot,
                           conv_before.begin() + slot * conv_per_slot))
        << "conv state of slot " << slot << " outside the step";
    EXPECT_TRUE(std::equal(got_delta.begin() + slot * delta_per_slot,
                           got_delta.begin() + (slot + 1) * delta_per_slot,
                           delta_before.begin() + slot * delta_per_slot))
        << "delta state of slot " << slot << " outside the step";
  }
  // The step moved the state (guards against a test that compares two untouched buffers).
  EXPECT_GT(rel_l2(st.ref_delta, delta_before), 1e-3);
}

class CudaDeltaNet : public ::testing::TestWithParam<DeltaCase> {};

TEST_P(CudaDeltaNet, MatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const DeltaCase& c = GetParam();
  // The chunked form is the default for long spans; the other cases hold the recurrent kernel.
  // Its tensor-core kernels are the default; kChunkedFp32 holds the fp32 ones.
  setenv("QWENRT_CUDA_CHUNKED", c.form != Form::kRecurrent ? "1" : "0", 1);
  setenv("QWENRT_CUDA_CHUNKED_TC", c.form == Form::kChunkedFp32 ? "0" : "1", 1);
  struct Unset {
    ~Unset() {
      unsetenv("QWENRT_CUDA_CHUNKED");
      unsetenv("QWENRT_CUDA_CHUNKED_TC");
    }
  } unset;
  std::mt19937_64 rng(c.hk * 1000 + c.hv * 100 + c.d + c.counts.size() * 7 + c.counts[0]);
  const Layer layer(c.hk, c.hv, c.d, rng);
  const int n_slots = *std::max_element(c.slots.begin(), c.slots.end()) + 2;
  States states(layer, n_slots, c.fresh, rng);

  std::vector<int> n_past;
  for (size_t s = 0; s < c.counts.size(); ++s) n_past.push_back(c.fresh ? 0 : 5 + 11 * int(s));
  run_step(layer, make_step(c.counts, c.slots, n_past, n_slots), states, rng, "step1", c.form);

  // Step 2: every slot of step 1 decodes one more token, in the same slot order.
  std::vector<int> n_past2;
  for (size_t s = 0; s < c.counts.size(); ++s) n_past2.push_back(n_past[s] + c.counts[s]);
  run_step(layer, make_step(std::vector<int>(c.counts.size(), 1), c.slots, n_past2, n_slots),
           states, rng, "step2_decode", c.form);
}

// A decode step with the conv folded into the delta rule's launch (the default) against the same
// step on a backend that runs the conv launch first (QWENRT_CUDA_FUSED_CONV=0): out, the conv
// state and the delta state bit for bit (the same arithmetic), over two steps in a row (the
// second reuses the completion counters the first must have left zero).
TEST(CudaDeltaNetFoldedConv, EqualsTheConvLaunchBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  static Ops* unfolded = [] {
    setenv("QWENRT_CUDA_FUSED_CONV", "0", 1);
    Ops* ops = make_cuda_ops().release();
    unsetenv("QWENRT_CUDA_FUSED_CONV");
    return ops;
  }();
  std::mt19937_64 rng(77);
  const Layer l(16, 32, 128, rng);  // Qwen3.6's heads: two V heads a K head
  const std::vector<int> slots = {2, 0, 3};
  const int n_slots = 5;
  std::mt19937_64 rng_a(5), rng_b(5);
  States a(l, n_slots, false, rng_a), b(l, n_slots, false, rng_b);
  std::vector<int> n_past = {40, 7, 300};
  for (int step_i = 0; step_i < 2; ++step_i) {
    SCOPED_TRACE(step_i);
    const Step step = make_step({1, 1, 1}, slots, n_past, n_slots);
    const int64_t n = step.n();
    gpu().reset_workspace();
    gpu().begin_step(step.layout(DeltaNetMode::kAuto));
    const float* qkv = to_device(randn(n * l.C, rng));
    const float* z = to_device(randn(n * l.nv, rng));
    const float* alpha = to_device(randn(n * l.hv, rng));
    const float* beta = to_device(randn(n * l.hv, rng));
    float* out_a = to_device(std::vector<float>(n * l.nv, NAN));
    float* out_b = to_device(std::vector<float>(n * l.nv, NAN));
    auto args = [&](const States& st, float* out) {
      return l.device_args(qkv, z, alpha, beta, st.device, out);
    };
    cuda::DeviceStep shape;  // the bounds deltanet's choice reads
    shape.n = n;
    shape.n_spans = static_cast<int>(step.spans.size());
    shape.max_span_count = 1;
    ASSERT_EQ(cuda::deltanet_fused_conv_counters(shape, args(a, out_a)), 3 * l.hk)
        << "a decode step of these heads folds the conv";
    gpu().deltanet(args(a, out_a));
    const auto got_a = to_host(out_a, n * l.nv);
    unfolded->reset_workspace();
    unfolded->begin_step(step.layout(DeltaNetMode::kAuto));
    unfolded->deltanet(args(b, out_b));
    std::vector<float> got_b(n * l.nv);
    unfolded->download(out_b, got_b.data(), n * l.nv);
    EXPECT_TRUE(std::none_of(got_a.begin(), got_a.end(), [](float x) { return std::isnan(x); }));
    EXPECT_EQ(got_a, got_b) << "out";
    EXPECT_EQ(to_host(a.device.conv, a.conv_floats), to_host(b.device.conv, b.conv_floats))
        << "conv state";
    EXPECT_EQ(to_host(a.device.delta, a.delta_floats), to_host(b.device.delta, b.delta_floats))
        << "delta state";
    for (int& p : n_past) ++p;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaDeltaNet,
    ::testing::Values(
        DeltaCase{"decode_1", 2, 4, 64, {1}, {1}},
        DeltaCase{"decode_3_slots_out_of_order", 2, 4, 64, {1, 1, 1}, {2, 0, 1}},
        DeltaCase{"prefill_1_fresh", 2, 4, 64, {1}, {0}, true},
        DeltaCase{"prefill_63", 2, 4, 64, {63}, {1}},
        DeltaCase{"prefill_63_fresh", 2, 4, 128, {63}, {0}, true},
        DeltaCase{"prefill_200", 2, 4, 128, {200}, {2}},
        DeltaCase{"mixed_17_1_1", 2, 4, 64, {17, 1, 1}, {1, 3, 0}},
        DeltaCase{"mixed_17_1_1_d128", 2, 4, 128, {17, 1, 1}, {2, 0, 1}},
        DeltaCase{"straddling_conv_tiles", 2, 4, 64, {15, 2, 1, 30}, {3, 1, 0, 2}},
        DeltaCase{"qwen36_heads_decode", 16, 32, 128, {1, 1}, {1, 0}},
        DeltaCase{"qwen36_heads_mixed", 16, 32, 128, {9, 1}, {0, 2}},
        DeltaCase{"d32_hk1_hv3", 1, 3, 32, {40, 1}, {0, 1}},
        DeltaCase{"d96_hk_eq_hv", 2, 2, 96, {3, 1}, {1, 0}},
        DeltaCase{"d160_state_in_memory", 1, 2, 160, {5, 1}, {1, 0}},
        DeltaCase{"d256_state_in_memory", 1, 2, 256, {20, 1}, {0, 1}},
        // D not a multiple of 32: the one-thread-per-column kernel.
        DeltaCase{"d16_any_d_kernel", 2, 4, 16, {17, 1, 1}, {1, 2, 0}},
        DeltaCase{"d48_any_d_kernel", 1, 2, 48, {1, 1}, {0, 1}},
        // The chunked kernels on tensor cores (the default): partial and whole chunks, several
        // spans, Hk != Hv, D = 64 and 128.
        DeltaCase{"chunked_tc_1", 2, 4, 128, {1}, {1}, false, Form::kChunkedTc},
        DeltaCase{"chunked_tc_63", 2, 4, 128, {63}, {0}, false, Form::kChunkedTc},
        DeltaCase{"chunked_tc_64_fresh", 2, 4, 128, {64}, {0}, true, Form::kChunkedTc},
        DeltaCase{"chunked_tc_65", 2, 4, 128, {65}, {1}, false, Form::kChunkedTc},
        DeltaCase{"chunked_tc_1000", 2, 4, 128, {1000}, {0}, false, Form::kChunkedTc},
        DeltaCase{"chunked_tc_spans_130_1_64_7",
                  2,
                  4,
                  128,
                  {130, 1, 64, 7},
                  {2, 0, 3, 1},
                  false,
                  Form::kChunkedTc},
        DeltaCase{
            "chunked_tc_qwen36_heads", 16, 32, 128, {200, 1}, {0, 1}, false, Form::kChunkedTc},
        DeltaCase{"chunked_tc_d64_hk1_hv3", 1, 3, 64, {150, 20}, {1, 0}, false, Form::kChunkedTc},
        DeltaCase{"chunked_tc_d64_spans_1000_65_1",
                  2,
                  4,
                  64,
                  {1000, 65, 1},
                  {2, 0, 1},
                  false,
                  Form::kChunkedTc},
        DeltaCase{"chunked_tc_d64_63_fresh", 2, 6, 64, {63}, {0}, true, Form::kChunkedTc},
        // The fp32 chunked kernels (QWENRT_CUDA_CHUNKED_TC=0), held to 1e-4.
        DeltaCase{"chunked_fp32_1", 2, 4, 128, {1}, {1}, false, Form::kChunkedFp32},
        DeltaCase{"chunked_fp32_63", 2, 4, 128, {63}, {0}, false, Form::kChunkedFp32},
        DeltaCase{"chunked_fp32_64_fresh", 2, 4, 128, {64}, {0}, true, Form::kChunkedFp32},
        DeltaCase{"chunked_fp32_65", 2, 4, 128, {65}, {1}, false, Form::kChunkedFp32},
        DeltaCase{"chunked_fp32_1000", 2, 4, 128, {1000}, {0}, false, Form::kChunkedFp32},
        DeltaCase{"chunked_fp32_spans_130_1_64_7",
                  2,
                  4,
                  128,
                  {130, 1, 64, 7},
                  {2, 0, 3, 1},
                  false,
                  Form::kChunkedFp32},
        DeltaCase{
            "chunked_fp32_qwen36_heads", 16, 32, 128, {200, 1}, {0, 1}, false, Form::kChunkedFp32},
        DeltaCase{
            "chunked_fp32_d64_hk1_hv3", 1, 3, 64, {150, 20}, {1, 0}, false, Form::kChunkedFp32}),
    [](const ::testing::TestParamInfo<DeltaCase>& info) { return info.param.name; });

}  // namespace
}  // namespace qwenrt::ops
