#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace qwenrt::ops::cpu {
namespace {

// The call's arguments as the per-level bodies read them.
struct AttnArgs {
  const float* q;
  int64_t q_stride;
  const float* k_pages;
  const float* v_pages;
  const int32_t* page_tables;
  int64_t page_table_stride;
  int page_size;
  float* out;
  int n_head, n_head_kv, head_dim;
  float scale;
};

}  // namespace
}  // namespace qwenrt::ops::cpu

#define QWENRT_CPU_BODY "ops/cpu/attention_body.inc"
#include "ops/cpu/simd_instances.inc"

namespace qwenrt::ops::cpu {
namespace {

// One unit of work: a block of queries of one span against one kv head.
struct AttnTask {
  int span;
  int kv_head;
  int q_begin, q_end;  // query indices within the span
  int64_t cost;        // keys x rows: tasks run most expensive first
};

// Queries per task: enough rows (queries x group) to reuse each K/V block, few enough that the
// task's accumulators stay in L2 and that prefill splits into many tasks.
int queries_per_task(int group, int head_dim) {
  return std::max(1, 16384 / (group * head_dim));
}

}  // namespace

void attention(const Span* spans, int n_spans, const float* q, int64_t q_stride,
               const float* k_pages, const float* v_pages, const int32_t* page_tables,
               int64_t page_table_stride, int page_size, float* out, int n_head, int n_head_kv,
               int head_dim, float scale, ThreadPool& pool) {
  if (n_head_kv <= 0 || n_head % n_head_kv != 0) {
    fail("cpu attention: n_head {} is not a multiple of n_head_kv {}", n_head, n_head_kv);
  }
  if (head_dim % 16 != 0) fail("cpu attention: head_dim {} is not a multiple of 16", head_dim);
  if (page_size <= 0) fail("cpu attention: page_size {} must be positive", page_size);
  const int group = n_head / n_head_kv;
  const int per_task = queries_per_task(group, head_dim);
  thread_local std::vector<AttnTask> tasks;  // reused: no allocation once warm
  tasks.clear();
  for (int s = 0; s < n_spans; ++s) {
    for (int i0 = 0; i0 < spans[s].count; i0 += per_task) {
      const int i1 = std::min(spans[s].count, i0 + per_task);
      for (int h = 0; h < n_head_kv; ++h) {
        tasks.push_back({s, h, i0, i1, int64_t{spans[s].n_past + i1} * (i1 - i0)});
      }
    }
  }
  // std::sort, not stable_sort (which allocates a buffer): ties broken by position instead.
  std::sort(tasks.begin(), tasks.end(), [](const AttnTask& x, const AttnTask& y) {
    if (x.cost != y.cost) return x.cost > y.cost;
    if (x.span != y.span) return x.span < y.span;
    if (x.q_begin != y.q_begin) return x.q_begin < y.q_begin;
    return x.kv_head < y.kv_head;
  });
  const AttnArgs args{q,         q_stride, k_pages, v_pages,   page_tables, page_table_stride,
                      page_size, out,      n_head,  n_head_kv, head_dim,    scale};
  auto fn = QWENRT_CPU_PICK(attend_task);
  const std::vector<AttnTask>& list = tasks;
  run_tasks(pool, static_cast<int64_t>(list.size()), [&](int64_t t) {
    const AttnTask& task = list[t];
    fn(args, spans[task.span], task.kv_head, task.q_begin, task.q_end);
  });
}

}  // namespace qwenrt::ops::cpu
