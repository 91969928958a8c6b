// Qwen Sparse Attention (qwen4exp) on the cpu backend for steps whose queries see more complete
// blocks than the budget keeps: ref::qsa_attention_spans's definition, with each query's attention
// read in place from the pages (no gathered copies) and the queries spread over the thread pool.
#pragma once

#include "core/thread_pool.h"
#include "ops/types.h"

namespace qwenrt::ops::cpu {

// Whether no query of the step sees more complete blocks than the budget keeps: then QSA keeps
// every key (ref::qsa_select) and is dense causal attention.
bool qsa_keeps_every_key(const StepLayout& step, const QsaArgs& a);
// The step's raw indexer keys into their pages (the dense path's part of QSA besides attention).
void qsa_write_index_keys(const StepLayout& step, const QsaArgs& a);

// Per span: ref::qsa_append_and_pool (K, V and indexer keys into the pages, the pooled block
// keys), then per query ref::qsa_select and attention over the kept positions (fp32).
void qsa_attention_sparse(const StepLayout& step, const QsaArgs& a, ThreadPool& pool);

}  // namespace qwenrt::ops::cpu
