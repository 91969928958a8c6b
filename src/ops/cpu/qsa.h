// Qwen Sparse Attention (qwen4exp) on the cpu backend for steps whose queries see more complete
// blocks than the budget keeps: ref::qsa_attention_spans's definition, with each query's attention
// read in place from the pages (no gathered copies) and the queries spread over the thread pool.
#pragma once

#include "core/thread_pool.h"
#include "ops/types.h"

namespace qwenrt::ops::cpu {

// The step's K, V and raw indexer keys into their pages, each span's pooled block keys, then per
// query ref::qsa_select and attention over the kept positions (fp32, online softmax).
void qsa_attention_sparse(const StepLayout& step, const QsaArgs& a, ThreadPool& pool);

}  // namespace qwenrt::ops::cpu
