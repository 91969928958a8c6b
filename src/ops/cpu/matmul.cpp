#include "ops/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/matmul_gemm.h"
#include "ops/cpu/quant_dot.h"
#include "quant/quant.h"

namespace qwenrt::ops::cpu {

ScratchBuffer::~ScratchBuffer() {
  std::free(data_);
}

ScratchBuffer::ScratchBuffer(ScratchBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}

void* ScratchBuffer::get(size_t bytes) {
  if (bytes <= capacity_) return data_;
  // Grow by at least half again so a slowly growing caller does not reallocate every call.
  const size_t want = std::max(bytes, capacity_ + capacity_ / 2);
  const size_t rounded = (want + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::free(data_);
  data_ = p;
  capacity_ = rounded;
  return data_;
}

void Scratch::reserve_threads(int n) {
  if (static_cast<int>(per_thread.size()) < n) per_thread.resize(n);
  if (static_cast<int>(moe_per_thread.size()) < n) moe_per_thread.resize(n);
}

int64_t prepared_row_bytes(DType type, int64_t in) {
  return act_row_bytes(act_format(type), in);
}

void prepare_act_rows(DType type, const float* x, int64_t x_stride, int64_t in, int64_t n,
                      uint8_t* dst) {
  const ActFormat f = act_format(type);
  const int64_t rb = act_row_bytes(f, in);
  for (int64_t t = 0; t < n; ++t) quantize_act_row(f, x + t * x_stride, in, dst + t * rb);
}

namespace {

// Chunks per thread of a GEMV's rows (handed out dynamically; see matmul()).
constexpr int64_t kGemvChunksPerThread = 32;

// One weight row as fp32 (F32 rows are used in place).
const float* row_f32(const TensorView& w, int64_t r, float* buf) {
  if (w.dtype == DType::F32) return reinterpret_cast<const float*>(w.row(r));
  quant::dequantize(w.dtype, w.row(r), buf, w.ne[0]);
  return buf;
}

}  // namespace

void matmul_rows(const TensorView& w, int64_t r0, int64_t r1, const PreparedAct& act, float* y,
                 int64_t ldy, ScratchBuffer& tmp) {
  if (r0 >= r1 || act.n == 0) return;
  const Isa isa = active_isa();
  const int64_t in = w.ne[0];
  if (act_format(w.dtype) != ActFormat::kF32) {
    if (w.layout == Layout::kPanels16 || gemm_eligible(w.dtype, act.n, isa)) {
      gemm_rows(w, r0, r1, act, y, ldy, tmp);
      return;
    }
    const DotFn dot = dot_kernel(w.dtype, isa);
    const int64_t nb = in / traits(w.dtype).block_elems;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wr = w.row(r);
      for (int64_t t = 0; t < act.n; ++t)
        y[t * ldy + (r - r0)] = dot(nb, wr, act.data + t * act.stride);
    }
    return;
  }
  float* buf = tmp.get<float>(in);
  for (int64_t r = r0; r < r1; ++r) {
    const float* wr = row_f32(w, r, buf);
    for (int64_t t = 0; t < act.n; ++t) {
      const auto* xt = reinterpret_cast<const float*>(act.data + t * act.stride);
      y[t * ldy + (r - r0)] = dot_f32(wr, xt, in, isa);
    }
  }
}

void matmul(const TensorView& w, const float* x, float* y, int64_t n, Context& ctx) {
  const int64_t in = w.ne[0], out = w.ne[1];
  if (n <= 0 || out <= 0) return;
  const auto& tr = traits(w.dtype);
  if (!quant::can_dequantize(w.dtype) || in % tr.block_elems != 0) {
    fail("cpu matmul: weight type {} with {} inputs is not supported", tr.name, in);
  }
  const int n_threads = ctx.pool.size();
  ctx.scratch.reserve_threads(n_threads);
  const int64_t rb = prepared_row_bytes(w.dtype, in);
  auto* act = ctx.scratch.act.get<uint8_t>(static_cast<size_t>(n * rb));
  // Quantising is O(n * in), negligible next to the matmul, but at prefill sizes worth splitting.
  const int q_parts = n >= 16 ? n_threads : 1;
  ctx.pool.run(q_parts, [&](int p, int np) {
    const int64_t t0 = n * p / np, t1 = n * (p + 1) / np;
    prepare_act_rows(w.dtype, x + t0 * in, in, in, t1 - t0, act + t0 * rb);
  });
  const PreparedAct pa{act, rb, n};
  const int64_t units = (out + kRowAlign - 1) / kRowAlign;
  const bool streamed = w.layout == Layout::kPanels16 ? n <= kPanelStreamTokens
                                                      : !gemm_eligible(w.dtype, n, active_isa());
  if (n_threads > 1 && streamed && units >= kGemvChunksPerThread * n_threads) {
    // GEMV: memory-bound, and one core's share of the bandwidth moves from moment to moment, so
    // equal halves finish apart (the other core spins). Rows go out in chunks from a shared
    // counter instead; the last chunk bounds the imbalance.
    const int64_t chunk = units / (kGemvChunksPerThread * n_threads);
    const int64_t n_chunks = (units + chunk - 1) / chunk;
    std::atomic<int64_t> next{0};
    ctx.pool.run(n_threads, [&](int p, int) {
      for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
        const int64_t r0 = c * chunk * kRowAlign, r1 = std::min(out, (c + 1) * chunk * kRowAlign);
        matmul_rows(w, r0, r1, pa, y + r0, out, ctx.scratch.per_thread[p]);
      }
    });
    return;
  }
  // Rows split evenly (every row has the same bytes); tiny matrices stay on one thread.
  const int parts = static_cast<int>(std::min<int64_t>(n_threads, std::max<int64_t>(1, units)));
  ctx.pool.run(parts, [&](int p, int np) {
    const int64_t r0 = std::min(out, units * p / np * kRowAlign);
    const int64_t r1 = p + 1 == np ? out : std::min(out, units * (p + 1) / np * kRowAlign);
    matmul_rows(w, r0, r1, pa, y + r0, out, ctx.scratch.per_thread[p]);
  });
}

}  // namespace qwenrt::ops::cpu
