// Causal GQA attention over paged KV for a whole batch of spans in one call (flash style: online
// softmax, no score matrix), the CPU backend's form of ref::attention.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/cpu/common.h"

namespace qwenrt::ops::cpu {

// For every span s and query i < s.count, at position s.n_past + i, of every query head h:
//   out[s.begin + i][h] = softmax_j(scale * q[s.begin + i][h] . K[j][h / group]) V[j][h / group]
// over keys j = 0 .. n_past + i of slot s.slot (group = n_head / n_head_kv).
//   q: [n, n_head, head_dim], query rows q_stride floats apart (head h at h * head_dim).
//   k_pages, v_pages: [n_pages, page_size, n_head_kv, head_dim]; token t of a slot lives in page
//     page_tables[slot * page_table_stride + t / page_size], row t % page_size. The step's own
//     K/V rows (positions n_past .. n_past + count - 1) are already written.
//   out: [n, n_head, head_dim] contiguous; only rows of the spans are written.
// Requires n_head % n_head_kv == 0 and head_dim % 16 == 0 (64, 128, 256 are what models use).
// Work is split over (span, kv head, block of queries); all query heads of a kv head are done
// together so each K/V row is read once per group.
void attention(const Span* spans, int n_spans, const float* q, int64_t q_stride,
               const float* k_pages, const float* v_pages, const int32_t* page_tables,
               int64_t page_table_stride, int page_size, float* out, int n_head, int n_head_kv,
               int head_dim, float scale, ThreadPool& pool);

}  // namespace qwenrt::ops::cpu
