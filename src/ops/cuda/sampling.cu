// Sampling on the device (ref::sample_rows): one 1024-thread block per output row, rows in
// parallel. Every row setting is read on the device, so a captured graph replays with new ones.
//
// Per row (n = n_vocab):
//  1. Adjusted logits l (double, as ref): logits + bias, then the penalties over the history,
//     written to the row's scratch; a row with neither reads the raw logits as l.
//  2. One pass: the raw max (for log_z) and the arg max of l (ties to the lower id).
//  3. Greedy: that arg max. Otherwise the candidates are the top k of the order (l desc, id asc):
//     - k <= 1024 (the usual top_k): the k candidates are gathered into shared memory, sorted,
//       and softmax / top-p / min-p / the pick run on them with ref's arithmetic in ref's order;
//     - larger k (top_k off): q = exp((l - l0) / T) is stored per token, top-p is a radix select
//       by probability mass, min-p a per-token test (q falls along the order, so it keeps a
//       prefix), and the pick a block-wide prefix sum of the kept probabilities in id order.
//  4. Raw log-probabilities: log_z = max + log(sum exp), the top n_top by a radix select.
//
// The radix select finds the element of the order at which a cumulative weight (a count, or a
// fixed-point probability mass) first reaches a target, without sorting: 8-bit digits of the
// composite key (order-preserving key of the double l, then the complemented id, so that equal
// values rank the lower id first), one pass over the row per digit with a shared-memory
// histogram; it stops as soon as the chosen bucket is settled (one element, or a count target
// that takes the whole bucket). Real logits settle in 3-4 passes; exact ties take up to 11.
//
// Cost per row at n = 248320 (each pass reads the row from L2): greedy + logprobs ~7 passes over
// 1 MB; top_k <= 1024 adds ~5 passes; top_k off with top_p adds one pass of double exp and ~6
// passes over the 2 MB l and q arrays.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ops/cuda/check.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/pdl.cuh"

namespace qwenrt::ops::cuda {
namespace {

constexpr int kThreads = 1024;  // one block per row
constexpr int kWarps = kThreads / 32;
constexpr int kSmallK = kThreads;  // candidate sets up to this size are sorted in shared
constexpr int kIdBits = 24;        // the composite key's id part: n_vocab <= 2^24
constexpr uint32_t kIdMask = (1u << kIdBits) - 1;
constexpr int kKeyDigits = 8;  // 8-bit digits of the 64-bit value key
constexpr int kDigits = kKeyDigits + kIdBits / 8;
constexpr unsigned kFull = 0xffffffffu;
constexpr double kMassOne = 0x1p62;  // fixed-point scale of the normalised probability mass

// Order-preserving key of a double: a > b (as doubles) iff key(a) > key(b). -0 is made +0 first,
// because ref's comparisons hold them equal (the tie then goes to the lower id).
__device__ __forceinline__ uint64_t value_key(double v) {
  const uint64_t bits = static_cast<uint64_t>(__double_as_longlong(v + 0.0));
  return (bits >> 63) ? ~bits : bits | (uint64_t{1} << 63);
}
__device__ __forceinline__ uint32_t id_key(int64_t i) {
  return kIdMask - static_cast<uint32_t>(i);
}

// Digit d (0 = most significant) of the composite key (value key, id key).
__device__ __forceinline__ int digit(uint64_t key, uint32_t idk, int d) {
  if (d < kKeyDigits) return static_cast<int>((key >> (56 - 8 * d)) & 255);
  return static_cast<int>((idk >> (kIdBits - 8 - 8 * (d - kKeyDigits))) & 255);
}

// A threshold of the order: the top `level` digits of an element's composite key. An element is
// at or above it when its own top digits compare >= (`all`: every participant is).
struct Threshold {
  uint64_t key = 0;
  uint32_t idk = 0;
  int level = 0;
  bool all = true;
};

// -1 / 0 / 1: the top t.level digits of (key, idk) against t's.
__device__ __forceinline__ int compare_top(uint64_t key, uint32_t idk, const Threshold& t) {
  if (t.level <= kKeyDigits) {
    if (t.level == 0) return 0;
    const int shift = 64 - 8 * t.level;
    const uint64_t a = key >> shift, b = t.key >> shift;
    return (a > b) - (a < b);
  }
  if (key != t.key) return key > t.key ? 1 : -1;
  const int shift = kIdBits - 8 * (t.level - kKeyDigits);
  const uint32_t a = idk >> shift, b = t.idk >> shift;
  return (a > b) - (a < b);
}
__device__ __forceinline__ bool at_or_above(uint64_t key, uint32_t idk, const Threshold& t) {
  return t.all || compare_top(key, idk, t) >= 0;
}

struct SelectShared {
  uint32_t count[256];
  unsigned long long mass[256];
  unsigned long long remaining;  // the target less the weight of the buckets above the prefix
  uint64_t key;
  uint32_t idk;
  int level, done, all;
};

// The best candidate so far by (l desc, id asc).
struct Best {
  double l;
  int32_t id;
};
__device__ __forceinline__ bool better(double l, int64_t id, const Best& b) {
  return l > b.l || (l == b.l && id < b.id);
}

struct RowShared {
  SelectShared select;
  double red_d[kWarps];
  float red_f[kWarps];
  int red_i[kWarps];
  Best red_b[kWarps];
  // The small path's candidates: (l, id) sorted by the order, then the kept ones by id.
  double cand_l[kSmallK];
  double cand_q[kSmallK];
  float cand_p[kSmallK];
  int32_t cand_id[kSmallK];
  int n_found;
  int keep;
  double sum, kept;
  int32_t pick;
  float top_l[kMaxTopLogprobs];
  int32_t top_id[kMaxTopLogprobs];
};

// ---- Block-wide helpers (every thread calls; every thread gets the result) ----
// Partials combine in a fixed order, so the result is the same on every run. Any block of whole
// warps up to kThreads; scratch holds a value a warp.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(kFull, v, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) v = op(v, scratch[w]);
  __syncthreads();
  return v;
}
template <class T>
__device__ T block_sum(T v, T* scratch) {
  return block_reduce(
      v, [](T a, T b) { return a + b; }, scratch);
}
__device__ double block_sum(double v, RowShared& s) {
  return block_sum(v, s.red_d);
}
// The best (l desc, id asc) over the block.
__device__ Best block_best(Best v, Best* scratch) {
  for (int off = 16; off > 0; off /= 2) {
    const Best o{__shfl_xor_sync(kFull, v.l, off), __shfl_xor_sync(kFull, v.id, off)};
    if (better(o.l, o.id, v)) v = o;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) {
    if (better(scratch[w].l, scratch[w].id, v)) v = scratch[w];
  }
  __syncthreads();
  return v;
}
// Inclusive prefix sum over the threads in thread order.
__device__ double block_inclusive_scan(double v, RowShared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int off = 1; off < 32; off *= 2) {
    const double o = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += o;
  }
  if (lane == 31) s.red_d[warp] = v;
  __syncthreads();
  double before = 0;
  for (int w = 0; w < warp; ++w) before += s.red_d[w];
  __syncthreads();
  return before + v;
}

// The radix select. elem(i, key, idk, weight) gives element i's composite key and weight and
// says whether it takes part. Returns the threshold of the first element of the order (composite
// key descending) at which the cumulative weight of the participants reaches `target`; `all` when
// their total stays below it. kMass: the weights are fixed-point masses; otherwise counts (the
// weight argument is ignored and the target is a count).
template <bool kMass, class Elem>
__device__ Threshold block_select(int64_t n, unsigned long long target, SelectShared& s,
                                  const Elem& elem) {
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid == 0) {
    s.key = 0, s.idk = 0, s.level = 0, s.done = 0, s.all = 0;
    s.remaining = target;
  }
  for (int d = 0; d < kDigits; ++d) {
    for (int b = tid; b < 256; b += kThreads) s.count[b] = 0, s.mass[b] = 0;
    __syncthreads();  // also publishes thread 0's prefix
    Threshold prefix;
    prefix.key = s.key, prefix.idk = s.idk, prefix.level = d, prefix.all = false;
    for (int64_t base = 0; base < n; base += kThreads) {  // whole warps iterate together
      const int64_t i = base + tid;
      uint64_t key = 0;
      uint32_t idk = 0;
      unsigned long long w = 0;
      const bool in = i < n && elem(i, key, idk, w) && compare_top(key, idk, prefix) == 0;
      const int bucket = in ? digit(key, idk, d) : 256;
      // Lanes of one bucket add their count once: the bulk of a row falls into few buckets of
      // the first digits, and same-address shared atomics serialise.
      const unsigned peers = __match_any_sync(kFull, bucket);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&s.count[bucket], __popc(peers));
      if constexpr (kMass) {
        if (peers == kFull) {  // the whole warp in one bucket (or none in): one atomic
          for (int off = 16; off > 0; off /= 2) w += __shfl_xor_sync(kFull, w, off);
          if (in && lane == 0) atomicAdd(&s.mass[bucket], w);
        } else if (in && w != 0) {
          atomicAdd(&s.mass[bucket], w);
        }
      }
    }
    __syncthreads();
    if (tid == 0) {
      // Buckets from the top of the order down: the first whose weight reaches what remains.
      // Empty buckets are skipped, so a zero target lands on the first element.
      unsigned long long above = 0;
      int chosen = -1;
      for (int b = 255; b >= 0; --b) {
        const uint32_t c = s.count[b];
        if (c == 0) continue;
        const unsigned long long w = kMass ? s.mass[b] : c;
        if (above + w >= s.remaining) {
          chosen = b;
          break;
        }
        above += w;
      }
      if (chosen < 0) {
        s.all = 1, s.done = 1;
      } else {
        s.remaining -= above;
        if (d < kKeyDigits) {
          s.key |= uint64_t(chosen) << (56 - 8 * d);
        } else {
          s.idk |= uint32_t(chosen) << (kIdBits - 8 - 8 * (d - kKeyDigits));
        }
        s.level = d + 1;
        const uint32_t c = s.count[chosen];
        // One element settles it; so does a count target that takes the whole bucket.
        s.done = c == 1 || (!kMass && c == s.remaining);
      }
    }
    __syncthreads();
    if (s.done) break;  // the same value for every thread
  }
  Threshold t;
  t.key = s.key, t.idk = s.idk, t.level = s.level, t.all = s.all != 0;
  __syncthreads();  // every thread has read s before the next select resets it
  return t;
}

// Sorts kSmallK entries in place so that before(a, b) holds for a ahead of b (bitonic network,
// one compare-exchange per thread per step). swap(a, b) exchanges entries.
template <class Before, class Swap>
__device__ void block_sort(const Before& before, const Swap& swap) {
  const int j = threadIdx.x;
  for (int size = 2; size <= kSmallK; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const int p = j ^ stride;
      if (p > j) {
        const bool forward = (j & size) == 0;
        if (forward ? before(p, j) : before(j, p)) swap(j, p);
      }
      __syncthreads();
    }
  }
}

// The pick among k <= kSmallK candidates, with ref's arithmetic in ref's order.
template <class Logit>
__device__ int32_t sample_small(int64_t n, int64_t k, const DeviceSamplingRow& row,
                                const Logit& logit, RowShared& s) {
  const int tid = threadIdx.x;
  Threshold top_k;
  if (k < n) {
    top_k = block_select<false>(n, static_cast<unsigned long long>(k), s.select,
                                [&](int64_t i, uint64_t& key, uint32_t& idk, unsigned long long&) {
                                  key = value_key(logit(i)), idk = id_key(i);
                                  return true;
                                });
  }
  if (tid == 0) s.n_found = 0;
  __syncthreads();
  for (int64_t i = tid; i < n; i += kThreads) {
    const double l = logit(i);
    if (!at_or_above(value_key(l), id_key(i), top_k)) continue;
    const int slot = atomicAdd(&s.n_found, 1);
    if (slot < kSmallK) s.cand_l[slot] = l, s.cand_id[slot] = static_cast<int32_t>(i);
  }
  __syncthreads();
  const int m = min(s.n_found, kSmallK);                              // == k
  if (tid >= m) s.cand_l[tid] = -INFINITY, s.cand_id[tid] = INT_MAX;  // sorts after every token
  __syncthreads();
  block_sort(
      [&](int a, int b) {
        return s.cand_l[a] > s.cand_l[b] ||
               (s.cand_l[a] == s.cand_l[b] && s.cand_id[a] < s.cand_id[b]);
      },
      [&](int a, int b) {
        const double l = s.cand_l[a];
        const int32_t id = s.cand_id[a];
        s.cand_l[a] = s.cand_l[b], s.cand_id[a] = s.cand_id[b];
        s.cand_l[b] = l, s.cand_id[b] = id;
      });
  if (tid < m) s.cand_q[tid] = exp((s.cand_l[tid] - s.cand_l[0]) / double(row.temperature));
  __syncthreads();
  if (tid == 0) {
    double sum = 0;
    for (int j = 0; j < m; ++j) sum += s.cand_q[j];
    s.sum = sum;
  }
  __syncthreads();
  if (tid < m) s.cand_q[tid] /= s.sum;
  __syncthreads();
  if (tid == 0) {
    int keep = m;
    if (row.top_p < 1) {
      double cum = 0;
      for (int j = 0; j < m; ++j) {
        cum += s.cand_q[j];
        if (cum >= row.top_p) {
          keep = j + 1;
          break;
        }
      }
    }
    if (row.min_p > 0) {
      const double floor = row.min_p * s.cand_q[0];
      int j = 1;
      while (j < keep && s.cand_q[j] >= floor) ++j;
      keep = j;
    }
    double kept = 0;
    for (int j = 0; j < keep; ++j) kept += s.cand_q[j];
    s.keep = keep, s.kept = kept;
  }
  __syncthreads();
  // ref walks the float probabilities in id order: sort the kept ones by id.
  const int keep = s.keep;
  if (tid < keep) {
    s.cand_p[tid] = static_cast<float>(s.cand_q[tid] / s.kept);
  } else {
    s.cand_p[tid] = 0, s.cand_id[tid] = INT_MAX;
  }
  __syncthreads();
  block_sort([&](int a, int b) { return s.cand_id[a] < s.cand_id[b]; },
             [&](int a, int b) {
               const float p = s.cand_p[a];
               const int32_t id = s.cand_id[a];
               s.cand_p[a] = s.cand_p[b], s.cand_id[a] = s.cand_id[b];
               s.cand_p[b] = p, s.cand_id[b] = id;
             });
  if (tid == 0) {
    double cum = 0;
    int32_t last = -1;
    for (int j = 0; j < keep; ++j) {
      if (s.cand_p[j] <= 0) continue;
      cum += s.cand_p[j];
      last = s.cand_id[j];
      if (row.u < cum) break;
    }
    s.pick = last;  // the loop's break, or the last kept id when rounding left u above the total
  }
  __syncthreads();
  return s.pick;
}

// The pick among k > kSmallK candidates (top_k off or large): per-token passes over the row.
// q_store [n] receives exp((l - l0) / T) of the candidates (0 elsewhere).
template <class Logit>
__device__ int32_t sample_large(int64_t n, int64_t k, const Best& best,
                                const DeviceSamplingRow& row, const Logit& logit, double* q_store,
                                RowShared& s) {
  const int tid = threadIdx.x;
  Threshold top_k;
  if (k < n) {
    top_k = block_select<false>(n, static_cast<unsigned long long>(k), s.select,
                                [&](int64_t i, uint64_t& key, uint32_t& idk, unsigned long long&) {
                                  key = value_key(logit(i)), idk = id_key(i);
                                  return true;
                                });
  }
  double sum = 0;
  for (int64_t i = tid; i < n; i += kThreads) {
    const double l = logit(i);
    double q = 0;
    if (at_or_above(value_key(l), id_key(i), top_k))
      q = exp((l - best.l) / double(row.temperature));
    q_store[i] = q;
    sum += q;
  }
  // The sum is a tree, not ref's running sum: the normalised q differ from ref's in the last
  // bits, which moves a top-p or min-p boundary by ~1e-16 (see the header of the test).
  const double inv_sum = 1.0 / block_sum(sum, s);  // block_sum's barrier publishes q_store
  Threshold top_p;
  if (row.top_p < 1) {
    const auto target = __double2ull_rn(fmax(double(row.top_p), 0.0) * kMassOne);
    top_p = block_select<true>(n, target, s.select,
                               [&](int64_t i, uint64_t& key, uint32_t& idk, unsigned long long& w) {
                                 const double q = q_store[i];
                                 key = value_key(logit(i)), idk = id_key(i);
                                 if (!at_or_above(key, idk, top_k)) return false;
                                 w = __double2ull_rn(q * inv_sum * kMassOne);
                                 return true;
                               });
  }
  const bool use_min_p = row.min_p > 0;
  const double floor = row.min_p * inv_sum;  // min_p * q[0], q[0] = exp(0) / sum
  // The normalised q of token i when it is kept, else 0.
  auto kept_q = [&](int64_t i) -> double {
    const double qn = q_store[i] * inv_sum;
    if (qn == 0) return 0;        // not a candidate, or ref's probability underflows to 0 anyway
    if (i == best.id) return qn;  // the first of the order is always kept
    const uint64_t key = value_key(logit(i));
    if (!at_or_above(key, id_key(i), top_p)) return 0;
    if (use_min_p && !(qn >= floor)) return 0;
    return qn;
  };
  double kept = 0;
  for (int64_t i = tid; i < n; i += kThreads) kept += kept_q(i);
  const double inv_kept = 1.0 / block_sum(kept, s);
  // The walk in id order: each thread sums the float probabilities of a contiguous chunk of ids,
  // a block scan orders the chunks, and the first chunk whose running total passes u walks its
  // ids again.
  const int64_t chunk = (n + kThreads - 1) / kThreads;
  const int64_t begin = std::min<int64_t>(n, tid * chunk),
                end = std::min<int64_t>(n, begin + chunk);
  double local = 0;
  int32_t last = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float p = static_cast<float>(kept_q(i) * inv_kept);
    if (p > 0) local += p, last = static_cast<int32_t>(i);
  }
  const double incl = block_inclusive_scan(local, s);
  const int first = block_reduce(
      row.u < incl ? tid : kThreads, [](int a, int b) { return min(a, b); }, s.red_i);
  const int32_t last_kept = block_reduce(
      last, [](int32_t a, int32_t b) { return max(a, b); }, s.red_i);
  if (tid == 0) s.pick = -1;
  __syncthreads();
  if (tid == first) {
    double cum = incl - local;
    int32_t pick = -1;
    for (int64_t i = begin; i < end; ++i) {
      const float p = static_cast<float>(kept_q(i) * inv_kept);
      if (p <= 0) continue;
      cum += p;
      pick = static_cast<int32_t>(i);
      if (row.u < cum) break;
    }
    s.pick = pick;
  }
  __syncthreads();
  // No chunk passes u (rounding left it above the total): the last kept id, as ref.
  return s.pick >= 0 ? s.pick : last_kept;
}

// logits [n_rows, n]; out [n_rows]. workspace: [n_rows][2][n] doubles (adjusted logits, then
// q_store, whose first half holds the penalties' history counts while l is built).
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t n, const DeviceSamplingRow* rows,
                  const int32_t* bias_ids, const float* bias_values, const int32_t* history,
                  SampledToken* out, double* workspace) {
  pdl_launch_dependents();
  __shared__ RowShared s;
  const int tid = threadIdx.x;
  const int64_t r = blockIdx.x;
  const DeviceSamplingRow row = rows[r];
  const float* raw = logits + r * n;
  double* adjusted_l = workspace + r * 2 * n;
  double* q_store = adjusted_l + n;
  int32_t* counts = reinterpret_cast<int32_t*>(q_store);

  // 1. The adjusted logits, as ref::sampling_distribution builds them (in double).
  const bool penalised =
      row.presence_penalty != 0 || row.frequency_penalty != 0 || row.repetition_penalty != 1;
  const bool adjusted = row.bias_count > 0 || penalised;
  if (adjusted) {
    for (int64_t i = tid; i < n; i += kThreads) {
      adjusted_l[i] = raw[i];
      if (penalised) counts[i] = 0;
    }
    __syncthreads();
    // Bias ids are distinct in practice (a map); a repeated id would add in any order.
    for (int j = tid; j < row.bias_count; j += kThreads) {
      const int32_t id = bias_ids[row.bias_begin + j];
      if (id >= 0 && id < n) atomicAdd(&adjusted_l[id], double(bias_values[row.bias_begin + j]));
    }
    if (penalised) {
      for (int j = tid; j < row.history_count; j += kThreads) {
        const int32_t t = history[row.history_begin + j];
        if (t >= 0 && t < n) atomicAdd(&counts[t], 1);
      }
    }
    __syncthreads();
    if (penalised) {
      // Each distinct token once: the first occurrence to take its count applies it.
      for (int j = tid; j < row.history_count; j += kThreads) {
        const int32_t t = history[row.history_begin + j];
        if (t < 0 || t >= n) continue;
        const int c = atomicExch(&counts[t], 0);
        if (c == 0) continue;
        double l = adjusted_l[t];
        // Repetition penalty as in CTRL / llama.cpp: shrink positive logits, grow negative ones.
        l = l > 0 ? l / row.repetition_penalty : l * row.repetition_penalty;
        l -= row.presence_penalty + double(row.frequency_penalty) * c;
        adjusted_l[t] = l;
      }
    }
    __syncthreads();
  }
  auto logit = [&](int64_t i) -> double { return adjusted ? adjusted_l[i] : double(raw[i]); };

  // 2. The raw max and the arg max of l.
  float raw_max = -INFINITY;
  Best best{-INFINITY, INT_MAX};
  for (int64_t i = tid; i < n; i += kThreads) {
    const float x = raw[i];
    raw_max = fmaxf(raw_max, x);
    const double l = adjusted ? adjusted_l[i] : double(x);
    if (better(l, i, best)) best = Best{l, static_cast<int32_t>(i)};
  }
  raw_max = block_reduce(
      raw_max, [](float a, float b) { return fmaxf(a, b); }, s.red_f);
  best = block_best(best, s.red_b);

  // 3. The token.
  int32_t id;
  if (row.temperature == 0) {
    id = best.id;  // ref's max_element: the first maximum (token 0 when every l is -inf)
  } else if (!isfinite(best.l)) {
    id = -1;  // every token excluded
  } else {
    const int64_t k = row.top_k > 0 ? std::min<int64_t>(row.top_k, n) : n;
    id = k <= kSmallK ? sample_small(n, k, row, logit, s)
                      : sample_large(n, k, best, row, logit, q_store, s);
  }

  // 4. Raw log-probabilities. exp in float is within ~1e-7 relative of ref's double exp, which
  // the sum (in double) carries into log_z as ~1e-7 absolute.
  double z = 0;
  for (int64_t i = tid; i < n; i += kThreads) z += expf(raw[i] - raw_max);
  const double log_z = double(raw_max) + log(block_sum(z, s));
  const int n_top = max(0, min(row.n_top, static_cast<int>(std::min<int64_t>(kMaxTopLogprobs, n))));
  if (n_top > 0) {
    Threshold top;
    if (n_top < n) {
      top = block_select<false>(n, static_cast<unsigned long long>(n_top), s.select,
                                [&](int64_t i, uint64_t& key, uint32_t& idk, unsigned long long&) {
                                  key = value_key(raw[i]), idk = id_key(i);
                                  return true;
                                });
    }
    if (tid == 0) s.n_found = 0;
    __syncthreads();
    for (int64_t i = tid; i < n; i += kThreads) {
      if (!at_or_above(value_key(raw[i]), id_key(i), top)) continue;
      const int slot = atomicAdd(&s.n_found, 1);
      if (slot < kMaxTopLogprobs) s.top_l[slot] = raw[i], s.top_id[slot] = static_cast<int32_t>(i);
    }
    __syncthreads();
  }
  if (tid == 0) {
    SampledToken tok;
    tok.id = id;
    tok.logprob = id >= 0 ? static_cast<float>(raw[id] - log_z) : 0.0f;
    tok.n_top = n_top;
    const int m = n_top > 0 ? min(n_top, s.n_found) : 0;  // == n_top
    for (int a = 0; a < m; ++a) {  // insertion sort of <= 20 by (raw desc, id asc)
      const float l = s.top_l[a];
      const int32_t i = s.top_id[a];
      int b = a;
      for (; b > 0 && (tok.top_logprobs[b - 1] < l ||
                       (tok.top_logprobs[b - 1] == l && tok.top_ids[b - 1] > i));
           --b) {
        tok.top_logprobs[b] = tok.top_logprobs[b - 1], tok.top_ids[b] = tok.top_ids[b - 1];
      }
      tok.top_logprobs[b] = l, tok.top_ids[b] = i;
    }
    for (int a = 0; a < m; ++a) {
      tok.top_logprobs[a] = static_cast<float>(tok.top_logprobs[a] - log_z);
    }
    out[r] = tok;
  }
}

// ---- Plain greedy rows (no bias, no penalties, no top log-probabilities) ----
// The general kernel gives a row one block, which reads 1 MB of logits at one SM's latency-bound
// rate (~80 us at 248k). Plain greedy needs only the first maximum and log-sum-exp: many blocks
// per row take a slice each (partial max, its first index, sum of exp relative to the partial
// max), and one block per row combines the partials.
constexpr int kGreedyThreads = 256;
constexpr int kGreedySlices = 32;

struct GreedyPart {
  float max;
  int32_t id;
  float sum;  // sum over the slice of exp(x - max)
};

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_parts_kernel(const float* __restrict__ logits, int64_t n,
                        GreedyPart* __restrict__ parts) {
  pdl_launch_dependents();
  __shared__ float s_max[kGreedyThreads / 32];
  __shared__ int32_t s_id[kGreedyThreads / 32];
  __shared__ float s_sum[kGreedyThreads / 32];
  const int64_t row = blockIdx.y;
  const float* x = logits + row * n;
  const int64_t per = (n + kGreedySlices - 1) / kGreedySlices;
  const int64_t begin = blockIdx.x * per, end = min(n, begin + per);
  float m = -INFINITY, sum = 0.0f;
  int32_t id = INT_MAX;
  for (int64_t i = begin + threadIdx.x; i < end; i += kGreedyThreads) {
    const float v = x[i];
    if (v > m) {  // ascending i per thread: the first maximum
      sum = sum * expf(m - v) + 1.0f;
      m = v;
      id = static_cast<int32_t>(i);
    } else {
      sum += expf(v - m);
    }
  }
  // Warp, then block: combine (max, first id, sum rescaled to the larger max).
  auto merge = [](float& m, int32_t& id, float& sum, float om, int32_t oid, float osum) {
    if (om > m || (om == m && oid < id)) {
      sum = (m == -INFINITY ? 0.0f : sum * expf(m - om)) + osum;
      m = om;
      id = oid;
    } else if (om != -INFINITY) {
      sum += osum * expf(om - m);
    }
  };
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const int32_t oid = __shfl_xor_sync(0xffffffffu, id, off);
    const float os = __shfl_xor_sync(0xffffffffu, sum, off);
    merge(m, id, sum, om, oid, os);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) s_max[warp] = m, s_id[warp] = id, s_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kGreedyThreads / 32; ++w) merge(m, id, sum, s_max[w], s_id[w], s_sum[w]);
    parts[row * kGreedySlices + blockIdx.x] = GreedyPart{m, id, sum};
  }
}

__global__ void greedy_combine_kernel(const float* __restrict__ logits, int64_t n,
                                      const GreedyPart* __restrict__ parts,
                                      SampledToken* __restrict__ out) {
  pdl_launch_dependents();
  const int64_t row = blockIdx.x;
  if (threadIdx.x != 0) return;
  const GreedyPart* p = parts + row * kGreedySlices;
  float m = -INFINITY;
  int32_t id = INT_MAX;
  for (int b = 0; b < kGreedySlices; ++b) {
    if (p[b].max > m || (p[b].max == m && p[b].id < id)) m = p[b].max, id = p[b].id;
  }
  double z = 0;
  for (int b = 0; b < kGreedySlices; ++b) {
    if (p[b].max != -INFINITY) z += double(p[b].sum) * exp(double(p[b].max) - double(m));
  }
  SampledToken tok;
  // ref's max_element over all -inf (or NaN-free) logits: token 0.
  if (id == INT_MAX) id = 0;
  tok.id = id;
  tok.logprob = static_cast<float>(double(logits[row * n + id]) - (double(m) + log(z)));
  tok.n_top = 0;
  out[row] = tok;
}

// The same pick in one launch (QWENRT_CUDA_GREEDY_ONE=1; opt-in until measured on a GPU): a row
// split over up to kPickBlocks blocks of ~kPickPerBlock logits (4 a thread at 248k), each taking
// its slice's first maximum, then the sum of exp relative to it in a second pass over the same
// elements (no exp on the running maximum's chain); the row's last block to finish (a completion
// counter a row, which it resets) merges the partials, one a thread, in double.
constexpr int kPickBlocks = 256;
constexpr int kPickPerBlock = 1024;
static_assert(kPickBlocks <= kGreedyThreads, "the merge gives each partial a thread");

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_pick_kernel(const float* __restrict__ logits, int64_t n, GreedyPart* __restrict__ parts,
                       unsigned* __restrict__ counters, SampledToken* __restrict__ out,
                       bool logprobs) {
  pdl_launch_dependents();
  __shared__ Best s_b[kGreedyThreads / 32];
  __shared__ float s_f[kGreedyThreads / 32];
  __shared__ double s_d[kGreedyThreads / 32];
  __shared__ bool s_last;
  const int64_t row = blockIdx.y;
  const int G = gridDim.x;
  const float* x = logits + row * n;
  const int64_t per = (n + G - 1) / G;
  const int64_t begin = blockIdx.x * per, end = min(n, begin + per);
  float m = -INFINITY;
  int32_t id = INT_MAX;
  for (int64_t i = begin + threadIdx.x; i < end; i += kGreedyThreads) {
    const float v = x[i];
    if (v > m) m = v, id = static_cast<int32_t>(i);  // ascending i per thread: the first
  }
  const Best slice = block_best(Best{m, id}, s_b);  // ties to the lower id
  m = static_cast<float>(slice.l);
  float sum = 0.0f;  // without log-probabilities: the maximum only (the token's logprob is 0)
  if (logprobs && m != -INFINITY) {
    for (int64_t i = begin + threadIdx.x; i < end; i += kGreedyThreads) sum += expf(x[i] - m);
  }
  sum = block_sum(sum, s_f);
  if (threadIdx.x == 0) {
    parts[row * G + blockIdx.x] = GreedyPart{m, slice.id, sum};
    __threadfence();
    s_last = atomicAdd(counters + row, 1u) == static_cast<unsigned>(G - 1);
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  GreedyPart p{-INFINITY, INT_MAX, 0.0f};
  if (int(threadIdx.x) < G) {
    const GreedyPart* q = parts + row * G + threadIdx.x;
    p = GreedyPart{__ldcg(&q->max), __ldcg(&q->id), __ldcg(&q->sum)};
  }
  const Best top = block_best(Best{p.max, p.id}, s_b);
  const float M = static_cast<float>(top.l);
  double z = 0.0;
  if (logprobs) {
    z = block_sum(p.max != -INFINITY ? double(p.sum) * exp(double(p.max) - double(M)) : 0.0, s_d);
  }
  if (threadIdx.x == 0) {
    SampledToken tok;
    // ref's max_element over all -inf logits: token 0
    const int32_t best = top.id == INT_MAX ? 0 : top.id;
    tok.id = best;
    tok.logprob = logprobs ? static_cast<float>(double(x[best]) - (double(M) + log(z))) : 0.0f;
    tok.n_top = 0;
    out[row] = tok;
    counters[row] = 0;  // ready for the next launch (graph replays too)
  }
}

}  // namespace

int64_t sample_workspace_bytes(int64_t n_rows, int64_t n_vocab) {
  return n_rows * 2 * n_vocab * int64_t{sizeof(double)};
}

int64_t sample_greedy_workspace_bytes(int64_t n_rows) {
  return n_rows * std::max(kGreedySlices, kPickBlocks) * int64_t{sizeof(GreedyPart)};
}

static bool greedy_one_launch() {
  const char* v = std::getenv("QWENRT_CUDA_GREEDY_ONE");
  return v && std::string(v) == "1";
}

void sample_greedy(const float* logits, int64_t n_vocab, int64_t n_rows, SampledToken* out,
                   void* workspace, unsigned* counters, bool logprobs, cudaStream_t stream) {
  if (n_rows == 0) return;
  if (n_rows > 65535) cuda_fail("sampling: " + std::to_string(n_rows) + " greedy rows at once");
  auto* parts = static_cast<GreedyPart*>(workspace);
  if (counters && greedy_one_launch()) {
    const int64_t blocks =
        std::clamp<int64_t>((n_vocab + kPickPerBlock - 1) / kPickPerBlock, 1, kPickBlocks);
    greedy_pick_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(n_rows)),
                         kGreedyThreads, 0, stream>>>(logits, n_vocab, parts, counters, out,
                                                      logprobs);
    QWENRT_CUDA_CHECK_LAUNCH();
    return;
  }
  greedy_parts_kernel<<<dim3(kGreedySlices, static_cast<unsigned>(n_rows)), kGreedyThreads, 0,
                        stream>>>(logits, n_vocab, parts);
  QWENRT_CUDA_CHECK_LAUNCH();
  greedy_combine_kernel<<<static_cast<unsigned>(n_rows), 32, 0, stream>>>(logits, n_vocab, parts,
                                                                          out);
  QWENRT_CUDA_CHECK_LAUNCH();
}

void sample(const float* logits, int64_t n_vocab, const DeviceSamplingRow* rows, int64_t n_rows,
            const int32_t* bias_ids, const float* bias_values, const int32_t* history,
            SampledToken* out, void* workspace, cudaStream_t stream) {
  if (n_rows == 0) return;
  if (n_vocab < 1 || n_vocab > int64_t{kIdMask} + 1) {
    cuda_fail("sampling: n_vocab " + std::to_string(n_vocab) + " is outside [1, " +
              std::to_string(int64_t{kIdMask} + 1) + "]");
  }
  if (n_rows > INT_MAX) {
    cuda_fail("sampling: " + std::to_string(n_rows) + " rows exceed the grid limit");
  }
  sample_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(
      logits, n_vocab, rows, bias_ids, bias_values, history, out, static_cast<double*>(workspace));
  QWENRT_CUDA_CHECK_LAUNCH();
}

}  // namespace qwenrt::ops::cuda
