// Micro-benchmark of the CPU backend's matmul and fused MoE (not a test).
// Build: ninja -C build cpu_matmul_bench. Run: build/cpu_matmul_bench [filter]
// Prints the machine's read bandwidth (sum over 1 GiB, 1 and 2 threads), then GB/s of weight
// bytes for GEMV (n = 1) and GMAC/s for GEMM (n = 512), with 1 and 2 threads.
// Weights are random bytes (timing does not depend on the values).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/repack.h"

using namespace qwenrt;
using namespace qwenrt::ops::cpu;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void fill_random(void* p, size_t bytes, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(b + i, &s, 8);
  }
  for (; i < bytes; ++i) b[i] = static_cast<uint8_t>(i);
}

// Seconds per call: the best of repeats after a warm-up, at least `min_time` in all.
template <class F>
double time_best(F&& f, double min_time = 1.0) {
  f();
  double best = 1e30, start = now();
  int reps = 0;
  while (reps < 3 || now() - start < min_time) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
    ++reps;
  }
  return best;
}

struct Owned {
  std::vector<uint8_t> bytes;
  TensorView view;
};
Owned random_tensor(DType t, int64_t in, int64_t out, int64_t n_mat = 1) {
  Owned o;
  const auto& tr = traits(t);
  o.bytes.resize(in / tr.block_elems * tr.block_bytes * out * n_mat);
  fill_random(o.bytes.data(), o.bytes.size(), in * 31 + out);
  // Random fp16 scales can be NaN or subnormal (slow paths that real weights never take): set
  // every block's scales to 2^-10 (0x1400).
  const int scale_at[2] = {t == DType::Q6_K ? 208 : 0,
                           t == DType::Q4_K || t == DType::Q5_K ? 2 : -1};
  if (t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0) {
    for (size_t b = 0; b + tr.block_bytes <= o.bytes.size(); b += tr.block_bytes)
      for (int at : scale_at)
        if (at >= 0) o.bytes[b + at] = 0x00, o.bytes[b + at + 1] = 0x14;
  }
  o.view = TensorView::contiguous(t, n_mat > 1 ? 3 : 2, {in, out, n_mat, 1}, o.bytes.data());
  return o;
}

void bandwidth() {
  const size_t n = (size_t{1} << 30) / 8;
  std::vector<uint64_t> a(n, 1);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::vector<uint64_t> sums(threads);
    const double s = time_best([&] {
      pool.run(threads, [&](int p, int np) {
        uint64_t acc[8] = {};
        const size_t b = n * p / np, e = n * (p + 1) / np;
        for (size_t i = b; i + 8 <= e; i += 8)
          for (int l = 0; l < 8; ++l) acc[l] += a[i + l];
        sums[p] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
      });
    });
    fmt::print("read bandwidth, {} thread(s): {:.1f} GB/s\n", threads, n * 8 / s / 1e9);
  }
}

void bench_matmul(DType t, int64_t in, int64_t out, int64_t n) {
  const Owned w = random_tensor(t, in, out);
  std::vector<float> x(n * in), y(n * out);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 500 - 1;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    Scratch scratch;
    Context ctx{pool, scratch};
    const double s =
        time_best([&] { matmul(w.view, x.data(), y.data(), n, ctx); }, n == 1 ? 1.0 : 2.0);
    const double bytes = double(w.bytes.size()), macs = double(in) * out * n;
    fmt::print("{:6} [{} x {}] n={:3} {}T: {:8.3f} ms  {:6.1f} GB/s  {:6.1f} GMAC/s\n",
               dtype_name(t), in, out, n, threads, s * 1e3, bytes / s / 1e9, macs / s / 1e9);
  }
}

void bench_moe(int64_t n) {
  const int64_t dim = 2048, ff = 512, n_expert = 256;
  const int k = 8;
  Owned router = random_tensor(DType::F32, dim, n_expert);
  // Random router logits must be finite: small values.
  auto* rf = reinterpret_cast<float*>(router.bytes.data());
  for (int64_t i = 0; i < dim * n_expert; ++i) rf[i] = static_cast<float>((i * 7919) % 1001) / 1e4f;
  Owned gate = random_tensor(DType::Q4_K, dim, ff, n_expert);
  Owned up = random_tensor(DType::Q4_K, dim, ff, n_expert);
  Owned down = random_tensor(DType::Q6_K, ff, dim, n_expert);
  Owned sgi = random_tensor(DType::F32, dim, 1);
  std::memset(sgi.bytes.data(), 0, sgi.bytes.size());
  Owned sg = random_tensor(DType::Q4_K, dim, ff), su = random_tensor(DType::Q4_K, dim, ff);
  Owned sd = random_tensor(DType::Q6_K, ff, dim);
  ops::MoeWeights w;
  w.router = {"router", router.view};
  w.gate_exps = {"gate", gate.view};
  w.up_exps = {"up", up.view};
  w.down_exps = {"down", down.view};
  w.shared_gate_inp = {"sgi", sgi.view};
  w.shared_gate = {"sg", sg.view};
  w.shared_up = {"su", su.view};
  w.shared_down = {"sd", sd.view};
  std::vector<float> x(n * dim), y(n * dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 500 - 1;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    Scratch scratch;
    Context ctx{pool, scratch};
    const double s = time_best([&] { moe_ffn(w, x.data(), y.data(), n, n_expert, k, ctx); });
    // Bytes of the experts actually touched (all 256 at n = 512, 8 at n = 1) + shared.
    const double per_expert =
        double(gate.bytes.size() + up.bytes.size() + down.bytes.size()) / n_expert;
    const double touched = std::min<double>(n_expert, n * k) * per_expert +
                           double(sg.bytes.size() + su.bytes.size() + sd.bytes.size());
    const double macs = double(n) * (k + 1) * 3 * dim * ff;
    fmt::print(
        "MoE 256x top-8 ff 512 + shared, n={:3} {}T: {:8.3f} ms  {:6.1f} GB/s  {:6.1f} "
        "GMAC/s\n",
        n, threads, s * 1e3, touched / s / 1e9, macs / s / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  auto want = [&](const char* name) {
    return filter.empty() || filter.find(name) != std::string::npos ||
           std::string(name).find(filter) != std::string::npos;
  };
  if (want("bw")) bandwidth();
  if (want("pool")) {  // the cost of one empty parallel region
    ThreadPool pool(2);
    int sink = 0;
    const int reps = 100000;
    const double s = time_best([&] {
      for (int i = 0; i < reps; ++i) pool.run(2, [&](int p, int) { sink += p == 0; });
    });
    fmt::print("ThreadPool::run, 2 threads, empty region: {:.2f} us ({})\n", s / reps * 1e6,
               sink > 0);
  }
  if (want("gemv")) {
    bench_matmul(DType::Q6_K, 2048, 248320, 1);
    bench_matmul(DType::Q4_K, 5120, 17408, 1);
    bench_matmul(DType::Q4_K, 2048, 8192, 1);
    bench_matmul(DType::Q6_K, 2048, 8192, 1);
    bench_matmul(DType::Q8_0, 2048, 8192, 1);
  }
  if (want("gemm")) {
    bench_matmul(DType::Q4_K, 5120, 17408, 512);
    bench_matmul(DType::Q4_K, 2048, 8192, 512);
    bench_matmul(DType::Q6_K, 2048, 8192, 512);
    bench_matmul(DType::Q8_0, 2048, 8192, 512);
  }
  if (want("small")) {  // few tokens: where the panel path starts to pay
    for (int64_t n : {2, 4, 8, 16}) bench_matmul(DType::Q4_K, 2048, 8192, n);
  }
  if (want("rows")) {  // a speculative check's few rows: cost against one row, 2 threads
    for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
      const int64_t in = 5120,
                    out = std::getenv("BENCH_OUT") ? std::atoll(std::getenv("BENCH_OUT")) : 17408;
      const Owned w = random_tensor(t, in, out);
      ThreadPool pool(std::getenv("BENCH_T") ? std::atoi(std::getenv("BENCH_T")) : 2);
      Scratch scratch;
      Context ctx{pool, scratch};
      std::vector<uint8_t> panels(w.bytes.size() + 64);
      uint8_t* aligned =
          panels.data() + (64 - reinterpret_cast<uintptr_t>(panels.data()) % 64) % 64;
      const TensorView pv = repack_panels(w.view, aligned);
      for (const TensorView* v : {&w.view, &pv}) {
        double one = 0;
        for (int64_t n : {1, 2, 3, 4, 5, 6, 8, 12, 16}) {
          std::vector<float> x(n * in), y(n * out);
          for (size_t i = 0; i < x.size(); ++i)
            x[i] = static_cast<float>((i * 7919) % 1000) / 500 - 1;
          const double s = time_best([&] { matmul(*v, x.data(), y.data(), n, ctx); }, 0.5);
          if (n == 1) one = s;
          fmt::print("{:6} {:6} [{} x {}] n={:2} 2T: {:7.3f} ms  {:5.2f}x one row  {:6.1f} GB/s\n",
                     dtype_name(t), v == &pv ? "panels" : "rows", in, out, n, s * 1e3, s / one,
                     w.bytes.size() / s / 1e9);
        }
      }
    }
  }
  if (want("moe")) {
    bench_moe(1);
    bench_moe(512);
  }
}
