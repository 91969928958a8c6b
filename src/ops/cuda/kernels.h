// The CUDA backend's kernels, as host-callable launchers (each .cu file of this folder implements
// one group; cuda_ops.cu runs the Ops interface on them). Every pointer is device memory unless
// named host; every launcher enqueues on `stream` and never synchronises. What each computes is
// the ops/ref function named beside it: the kernel tests compare them on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/types.h"

namespace qwenrt::ops::cuda {

// ---- Weights ----
// A weight in device memory, ggml order: `in` elements per row (contiguous), `out` rows
// `row_bytes` apart; 3D expert tensors hold n_expert such matrices `expert_bytes` apart.
struct Matrix {
  DType dtype = DType::F32;
  int64_t in = 0, out = 0, n_expert = 1;
  int64_t row_bytes = 0, expert_bytes = 0;
  const void* data = nullptr;
  // Q8_0 whose rows were repacked into superblocks of eight blocks (repack_q8_0_superblocks).
  bool q8_superblocks = false;
};

// Q8_0 rows of `in` elements can be repacked when they are whole superblocks (in % 256 == 0).
bool q8_0_superblocks_fit(int64_t in);
// dst = src (GGUF Q8_0 blocks, `bytes` of whole 272-byte superblocks) repacked: per superblock the
// eight fp16 scales, then the eight 32-byte quant arrays (quant_blocks.cuh, Q80S). src and dst
// are device memory, 16-byte aligned, not overlapping.
void repack_q8_0_superblocks(const void* src, void* dst, int64_t bytes, cudaStream_t stream);

// Types the matmul / embed kernels read as they are: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, IQ4_XS, F32,
// F16, BF16. The backend converts every other type to F32 at load (quant/ dequantises it).
bool has_kernel(DType type);

// ---- The step on the device ----
// The step layout as begin_step uploaded it (device copies of the host arrays).
struct DeviceStep {
  const int32_t* tokens = nullptr;     // [n]
  const int32_t* positions = nullptr;  // [n]
  int64_t n = 0;
  const Span* spans = nullptr;  // [n_spans]
  int n_spans = 0;
  const int32_t* output_rows = nullptr;  // [n_output_rows]
  int64_t n_output_rows = 0;
  const int32_t* page_tables = nullptr;  // [n_slots, page_table_stride]
  int64_t page_table_stride = 0;
  // Host-known bounds for launch sizes that stay fixed while the values above change (a captured
  // graph replays with new values): no span holds more than max_tokens tokens after the step
  // (page_table_stride * page_size), and max_span_count bounds every span's count.
  int64_t max_tokens = 0;
  int64_t max_span_count = 0;
  DeltaNetMode deltanet_mode = DeltaNetMode::kAuto;  // how DeltaNet layers run long spans
  bool keep_states = false;  // some span keeps its recurrent states (a speculative check)
};

// ---- Matmul (matmul.cu) ----
// Device scratch a matmul of n rows needs (quantised activations, dequantised tiles); launchers
// below take a workspace of at least this many bytes. Expert launchers: n * k rows.
int64_t matmul_workspace_bytes(const Matrix& w, int64_t n);
// y [n, out] = x [n, in] @ W^T (ref::matmul).
void matmul(const Matrix& w, const float* x, float* y, int64_t n, void* workspace,
            cudaStream_t stream);
// Several matrices of the same `in` applied to one input in one pass (the input quantised once):
// y_i [n, w_i.out] = x @ W_i^T.
struct Projection {
  Matrix w;
  float* y = nullptr;
};
int64_t matmul_group_workspace_bytes(const Projection* p, int n_p, int64_t n);
void matmul_group(const Projection* p, int n_p, const float* x, int64_t n, void* workspace,
                  cudaStream_t stream);
// y [n, ff] = silu(x @ Wg^T) * (x @ Wu^T): the SwiGLU of a dense FFN or a shared expert, with a
// workspace of matmul_swiglu_workspace_bytes.
int64_t matmul_swiglu_workspace_bytes(const Matrix& gate, int64_t n);
void matmul_swiglu(const Matrix& gate, const Matrix& up, const float* x, float* y, int64_t n,
                   void* workspace, cudaStream_t stream);
// The dense int8 GEMM that matmul, matmul_group and matmul_swiglu run for 33..64 rows
// (QWENRT_CUDA_DENSE_MMQ), called directly with tiles of tile_rows rows (16, 32 or 64; 0: its own
// rule), for tests and benchmarks; false (nothing launched) where W has no such kernel. Workspace:
// matmul_workspace_bytes / matmul_swiglu_workspace_bytes.
bool matmul_mmq(const Matrix& w, const float* x, float* y, int64_t n, void* workspace,
                int tile_rows, cudaStream_t stream);
bool matmul_swiglu_mmq(const Matrix& gate, const Matrix& up, const float* x, float* y, int64_t n,
                       void* workspace, int tile_rows, cudaStream_t stream);
// Routed experts (ref::moe_experts), ids [n, k] on the device:
// y [n * k, ff] = silu(x[r] @ Wg[e]^T) * (x[r] @ Wu[e]^T) for row r, choice j, e = ids[r * k + j].
// Gate and up are 3D [in, ff, n_expert]; a fused gate_up tensor is passed as two views of it.
// step_rows (here and in experts_down_pairs / experts_down_combine): the rows the kernel is chosen
// for when these n are part of a larger step (streamed experts run a step in runs of rows, and
// each run must take the kernel the whole step takes: the kernels round differently); 0: n.
void experts_swiglu(const Matrix& gate, const Matrix& up, const int32_t* ids, int k, const float* x,
                    float* y, int64_t n, void* workspace, cudaStream_t stream,
                    int64_t step_rows = 0);
// y [n, out] = sum_j weights[r * k + j] * (x[r * k + j] @ Wd[ids[r * k + j]]^T), x [n * k, ff].
void experts_down(const Matrix& down, const int32_t* ids, const float* weights, int k,
                  const float* x, float* y, int64_t n, void* workspace, cudaStream_t stream);
// The same without the sum: y_pairs [n * k, out] = x[p] @ Wd[ids[p]]^T (moe_combine_pairs adds
// them). False, having launched nothing, where the type or layout has no such kernel.
bool experts_down_pairs(const Matrix& down, const int32_t* ids, int k, const float* x,
                        float* y_pairs, int64_t n, void* workspace, cudaStream_t stream,
                        int64_t step_rows = 0);
// experts_down_pairs and moe_combine_pairs in one launch (decode-sized steps): y [n, out] =
// sum_j weights[r k + j] (x[r k + j] @ Wd[ids[r k + j]]^T) + shared_scale[r] shared[r] (shared
// null: no shared expert). False, having launched nothing, where it has no kernel (the resident
// GEMV's types, ff a multiple of 256, k ff <= 8192, n k <= 128).
bool experts_down_combine(const Matrix& down, const int32_t* ids, const float* weights, int k,
                          const float* x, const float* shared, const float* shared_scale, float* y,
                          int64_t n, cudaStream_t stream, int64_t step_rows = 0);
// The MoE FFN of one decode row after routing (ids, weights [k] on the device; h [dim] its
// normed input) in two launches, no second stream: the chosen experts' gate / up into mid [k, ff]
// beside the shared expert's into shared_mid [shared ff], then out [dim] = sum_j weights[j]
// (mid[j] @ Wd[ids[j]]^T) + *shared_scale (shared_mid @ Wsd^T). False where the resident GEMV has
// no such pair of kernels for these types and shapes (nothing launched; launch false: only that
// check). With `route` (its n = 1; ids, weights, h and shared_scale those of the row), the
// routing in front as well: moe_norm_route and the two launches as one (moe_fused.cu; false where
// it has no kernel; off unless QWENRT_CUDA_MOE_FUSED=1).
struct NormRouteArgs;
struct MoeRow {
  Matrix gate, up, down, shared_gate, shared_up, shared_down;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int k = 0;
  const float* h = nullptr;
  float* mid = nullptr;
  float* shared_mid = nullptr;
  const float* shared_scale = nullptr;
  float* out = nullptr;
};
bool moe_row(const MoeRow& row, bool launch, cudaStream_t stream,
             const NormRouteArgs* route = nullptr);
// out [n, in] = rows tokens[0..n) of table (ref::embed_rows; ids are checked on the host).
void embed_rows(const Matrix& table, const int32_t* tokens, int64_t n, float* out,
                cudaStream_t stream);

// ---- MoE prefill (moe_gemm.cu): routed experts of many rows as grouped tensor-core GEMMs ----
// The pairs (row r, choice j) = r * k + j of ids [n, k], grouped by expert on the device.
struct ExpertOrder {
  const int32_t* pairs = nullptr;       // [n_pairs]: pair indices, expert by expert
  const int32_t* pair_start = nullptr;  // [n_expert + 1]: each expert's first position in pairs
  const int32_t* tile_start = nullptr;  // [n_expert + 1]: each expert's first tile of pairs
  int n_expert = 0;
  int64_t n_pairs = 0;
  int64_t max_tiles = 0;  // host-known bound on the tiles (the grouped launches' grid)
  int tile_rows = 0;      // pairs a tile
};
// Whether the grouped kernels take this expert tensor (a type with a kernel, in % 64 == 0).
bool grouped_experts_fit(const Matrix& w);
int64_t expert_order_workspace_bytes(int64_t n_pairs, int n_expert);
// The most experts order_by_expert takes (8 bytes of shared memory each, within what an sm_80+
// block may opt in to).
inline constexpr int kMaxOrderedExperts = 20480;
// Tiles of tile_rows pairs: grouped_tile_rows() for the kernels below, mmq_tile_rows() for
// mmq_experts.
ExpertOrder order_by_expert(const int32_t* ids, int64_t n_pairs, int n_expert, int tile_rows,
                            void* workspace, cudaStream_t stream);
int grouped_tile_rows();
// experts_swiglu's result (y [n * k, ff], pair order) from the ordered pairs; x [n, in]. Weights
// dequantised to bf16 and x rounded to bf16, fp32 accumulation.
void grouped_experts_swiglu(const Matrix& gate, const Matrix& up, const ExpertOrder& order, int k,
                            const float* x, float* y, cudaStream_t stream);
// experts_down_pairs's result (y_pairs [n * k, out]) from x [n * k, in], the same way.
void grouped_experts_down(const Matrix& down, const ExpertOrder& order, const float* x,
                          float* y_pairs, cudaStream_t stream);

// ---- MoE prefill on int8 tensor cores (moe_mmq.cu) ----
// The routed experts of many rows, both halves, from the ordered pairs: y_pairs [n * k, out] =
// down_e(silu(gate_e x) * up_e x) for each pair's expert e, x [n, in]. x and the hidden rows are
// quantised to int8 blocks of 32 as the GEMVs' activations are (the same integer dots as
// gemv_mma.cu), weights read as stored. Types Q4_K, Q5_K, Q6_K and Q8_0 in superblocks; in and ff
// multiples of 256.
bool mmq_experts_fit(const Matrix& gate, const Matrix& up, const Matrix& down);
// Pairs a tile for n_pairs pairs over n_expert experts (16, 32 or 64).
int mmq_tile_rows(int64_t n_pairs, int n_expert);
int64_t mmq_experts_workspace_bytes(int64_t n, int64_t in, int64_t n_pairs, int64_t ff);
void mmq_experts(const Matrix& gate, const Matrix& up, const Matrix& down, const ExpertOrder& order,
                 int k, const float* x, int64_t n, float* y_pairs, void* workspace,
                 cudaStream_t stream);
// QWENRT_CUDA_MOE_MMQ=0 keeps the bf16 grouped kernels (read per call).
bool mmq_experts_enabled();

// ---- L2 prefetch (prefetch.cu) ----
// Asks for [p, p + bytes) to be brought into L2 (device memory; no completion to wait for). A
// decode step issues it for weights a later kernel reads while the kernels between them leave the
// memory bus idle.
void l2_prefetch(const void* p, int64_t bytes, cudaStream_t stream);

// ---- Elementwise (elementwise.cu) ----
void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
             cudaStream_t stream);
// x += delta, then out = rmsnorm(x) (out may not alias x).
void add_rmsnorm(float* x, const float* delta, const float* weight, float* out, int64_t rows,
                 int64_t dim, float eps, cudaStream_t stream);
// ref::rope_neox at positions [n] (device).
void rope_neox(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim,
               int64_t token_stride, int n_rot, float theta, cudaStream_t stream);
// Ops::attention_heads in one launch (positions [n], device), equal to the unfused sequence bit
// for bit; only where attention_heads_fit (head_dim <= 256).
bool attention_heads_fit(int head_dim, int n_rot);
void attention_heads(const float* q_gate, const float* q_norm, const float* k_norm, float* q,
                     float* gate, float* k, const int32_t* positions, int64_t n, int n_head,
                     int n_head_kv, int head_dim, int n_rot, float theta, float eps,
                     cudaStream_t stream);
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out, int64_t rows,
                 int64_t cols, cudaStream_t stream);
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
             int64_t cols, cudaStream_t stream);
// out [n_rows, dim] = x rows rows[0..n_rows) (device indices).
void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n_rows, float* out,
                 cudaStream_t stream);

// ---- Attention (attention.cu) ----
// Ops::attention over the paged KV: appends k, v of every span's rows at positions n_past.. into
// the slot's pages (DeviceStep::page_tables), then causal GQA attention of each query row over its
// slot's keys (ref::attention_spans). Decode rows split long contexts across blocks.
int64_t attention_workspace_bytes(const DeviceStep& step, int n_head, int head_dim);
// What attention() may also do with its output: multiply it by sigmoid(gate) (rows gate_stride
// floats apart; only where attention_gate_fits: every span in the split shape), and merge the
// split chunks in the attention launch itself, given attention_counters() zeroed completion
// counters (left zero).
struct AttentionOutput {
  const float* gate = nullptr;
  int64_t gate_stride = 0;
  unsigned* counters = nullptr;
};
bool attention_gate_fits(const DeviceStep& step, const AttentionArgs& args, const float* gate,
                         int64_t gate_stride);
int64_t attention_counters(const DeviceStep& step, const AttentionArgs& args);
void attention(const DeviceStep& step, const AttentionArgs& args, void* workspace,
               cudaStream_t stream, const AttentionOutput& output = {});
// The prefill shape of attention (attention_prefill.cu; attention() calls it): the KV append and
// the output of the spans whose count * (n_head / n_head_kv) exceeds split_vectors (the others
// take attention.cu's split shape), on tensor cores (f16 inputs, fp32 accumulation and softmax).
// No workspace; attention() has checked the arguments.
void attention_prefill(const DeviceStep& step, const AttentionArgs& args, int split_vectors,
                       cudaStream_t stream);

// ---- DeltaNet (deltanet.cu) ----
// Ops::deltanet for every span (ref::deltanet_spans): conv1d + SiLU with the slot's conv state,
// L2 norms, gates, the gated delta rule with the slot's state, gated RMSNorm. The args' weights
// (conv, dt_bias, a, norm) are F32 tensors placed in device memory.
// Spans run the recurrence token by token, or (head_dim 64 or 128, a span of kChunkedMinTokens or
// more, or the step's mode kChunked; not with QWENRT_CUDA_CHUNKED=0, nor in a step that keeps
// states) the chunked form of deltanet_chunked.cu.
// A decode step (no span longer than a row, no states kept, conv taps 4, head_dim a multiple of
// 32 up to 128) folds the conv into the delta rule's launch when deltanet gets `counters`:
// deltanet_fused_conv_counters of them, zeroed (0: this step does not fold; null: never).
int64_t deltanet_workspace_bytes(const DeviceStep& step, const DeltaNetArgs& args);
int64_t deltanet_fused_conv_counters(const DeviceStep& step, const DeltaNetArgs& args);
void deltanet(const DeviceStep& step, const DeltaNetArgs& args, void* workspace, unsigned* counters,
              cudaStream_t stream);
// The chunked delta rule over every span (deltanet_chunked.cu), after the conv of deltanet.cu
// wrote `mixed`; its workspace holds the normalised q, k, the gates, U / W and each chunk's start
// state.
bool deltanet_chunked_supported(int head_dim);
int64_t deltanet_chunked_workspace_bytes(const DeviceStep& step, const DeltaNetArgs& args);
void deltanet_chunked(const DeviceStep& step, const DeltaNetArgs& args, const float* mixed,
                      int64_t C, const float* dt_bias, const float* a, const float* norm,
                      void* workspace, cudaStream_t stream);

// ---- MoE routing (moe.cu) ----
// ref::moe_route on logits [n, n_expert]: ids / weights [n, k]; with gate_inp [dim] (else null)
// also the shared expert's gate shared_scale [n] = sigmoid(x[r] . gate_inp). With prefetch, each
// chosen expert's slices of the given tensors are asked into L2 as soon as it is chosen (sm_90;
// the kernels that read them run next).
struct ExpertPrefetch {
  static constexpr int kMax = 3;
  const void* base[kMax] = {};  // expert 0 of each tensor (null: none)
  int64_t stride[kMax] = {};    // expert e at base + e * stride
  int64_t bytes[kMax] = {};     // of which this many bytes are read
};
void moe_route(const float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights,
               const float* x, const float* gate_inp, int64_t dim, float* shared_scale,
               cudaStream_t stream, const ExpertPrefetch& prefetch = {});
// Whether moe_route and moe_norm_route (up to 512 experts) take the top k on the float logits
// (unless QWENRT_CUDA_ROUTE_FAST=0, read per call): the same ids and weights (routing.cuh).
bool route_fast();
// add_rmsnorm, the router and moe_route of a decode-sized step in one launch
// (Ops::add_rmsnorm_moe): x [n, dim] += delta; h = rmsnorm(x) * norm (add_rmsnorm's floats, bit for
// bit); logits [n, n_expert] = h @ router^T (fp32 router [n_expert, dim]); then ids, weights and
// shared_scale as moe_route computes them from those logits. `counters` is kNormRouteMaxRows zeroed
// unsigned ints of device memory the kernel leaves zeroed. Takes what norm_route_fits says (n up to
// kNormRouteMaxRows, dim a multiple of 1024 up to 8192, 16-byte aligned rows, up to 512 experts).
constexpr int kNormRouteMaxRows = 16;
constexpr int kNormRouteMaxVec = 8;
struct NormRouteArgs {
  float* x;
  const float* delta;
  const float* norm;
  float eps;
  float* h;
  int64_t n, dim;
  const float* router;
  int n_expert, k;
  float* logits;
  unsigned* counters;
  int32_t* ids;
  float* weights;
  const float* gate_inp;  // null: no shared expert gate
  float* shared_scale;
  ExpertPrefetch prefetch;
};
bool norm_route_fits(const NormRouteArgs& a);
void moe_norm_route(const NormRouteArgs& a, cudaStream_t stream);
// out [n, dim] = sum_j weights[r, j] * pairs[r * k + j] + shared_scale[r] * shared [n, dim]
// (shared null: no shared expert).
void moe_combine_pairs(const float* pairs, const float* weights, int k, const float* shared,
                       const float* shared_scale, float* out, int64_t n, int64_t dim,
                       cudaStream_t stream);
// out [n, dim] = routed [n, dim] + shared_scale[r] * shared [n, dim].
void moe_combine(const float* routed, const float* shared, const float* shared_scale, float* out,
                 int64_t n, int64_t dim, cudaStream_t stream);

// ---- qwen4exp's own ops (qwen4exp.cu) ----
// ref::rmsnorm_grouped: out [rows, groups * dim] = per group g rmsnorm(x[r, g, :]) * weight[g, :]
// (weight [groups, dim] F32 on the device). out may be x.
void rmsnorm_grouped(const float* x, const float* weight, float* out, int64_t rows, int groups,
                     int64_t dim, float eps, cudaStream_t stream);
// ref::silu_scaled: out = silu(scale x), n floats (out may be x).
void silu_scaled(const float* x, float scale, float* out, int64_t n, cudaStream_t stream);
// ref::hc_mix: out [n, dim] = mean over s < hc of sigmoid(gate[r, s, :]) xn[r, s, :].
void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc, int64_t dim,
            cudaStream_t stream);
// ref::hc_inject: streams [n, hc, dim] += block [n, dim] * 2 sigmoid(inject [n, hc] / hc).
void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
               int64_t dim, cudaStream_t stream);
// ref::ple_gate: out [n, hc, dim] = sigmoid(signed sqrt(key . query / sqrt(dim))) value [n, dim].
void ple_gate(const float* key, const float* query, const float* value, float* out, int64_t n,
              int hc, int64_t dim, cudaStream_t stream);
// ref::ple_conv_spans for every span: the dilated causal depthwise conv + SiLU over each slot's
// ple_conv history and the span's rows, then the history (and, for keep_states spans, the
// history after each row) updated. The kernel tensor [K, C] is F32, F16 or BF16 on the device.
void ple_conv(const DeviceStep& step, const PleConvArgs& args, cudaStream_t stream);
// The device half of Ops::ple_embed (its rows are read and uploaded by the host): each span's
// slot's ple_tokens = staged_tokens [n_spans, ctx_len]; with staged_history [n_spans,
// history_rows, ctx_len] (not null) also the ple_tokens_history rows of keep_states spans.
void ple_tokens_update(const DeviceStep& step, const float* staged_tokens,
                       const float* staged_history, const RecurrentLayer& state, int ctx_len,
                       cudaStream_t stream);

// ---- Qwen Sparse Attention (qsa.cu) ----
// ref::qsa_attention_spans for every span of the step (step.max_tokens: the slot capacity in
// tokens): k, v and the raw indexer keys into the pages, the pooled block keys, each query's
// block selection and its attention over the kept positions; any head_dim and index_dim up to
// 256. Queries that keep every key (n_kv / ratio <= budget / ratio) attend causally to all.
int64_t qsa_workspace_bytes(const DeviceStep& step, const QsaArgs& args);
void qsa_attention(const DeviceStep& step, const QsaArgs& args, void* workspace,
                   cudaStream_t stream);
// Only the raw indexer keys of the step's rows into their pages: the dense path's part of QSA
// besides attention() (which appends k and v itself).
void qsa_write_index_keys(const DeviceStep& step, const QsaArgs& args, cudaStream_t stream);

// ---- Sampling (sampling.cu) ----
// One output row's settings on the device (SamplingRow with its arrays packed into the step's
// bias / history buffers).
struct DeviceSamplingRow {
  float temperature, top_p, min_p;
  int32_t top_k;
  float presence_penalty, frequency_penalty, repetition_penalty;
  int32_t bias_begin, bias_count;        // into bias_ids / bias_values
  int32_t history_begin, history_count;  // into history
  double u;
  int32_t n_top;
};
int64_t sample_workspace_bytes(int64_t n_rows, int64_t n_vocab);
// out [n_rows] (device) = ref::sample_rows of logits [n_rows, n_vocab] with rows [n_rows]; a row
// that excludes every token gets id -1 (the host turns it into an error).
void sample(const float* logits, int64_t n_vocab, const DeviceSamplingRow* rows, int64_t n_rows,
            const int32_t* bias_ids, const float* bias_values, const int32_t* history,
            SampledToken* out, void* workspace, cudaStream_t stream);

// The same for rows that are all plain greedy (temperature 0, no bias, no penalties, n_top 0):
// the first maximum and its log-probability, the row split over many blocks. Given n_rows zeroed
// completion counters (left zero) and QWENRT_CUDA_GREEDY_ONE=1, in one launch (read per call),
// which skips the log-partition where no row wants log-probabilities (logprob then 0).
int64_t sample_greedy_workspace_bytes(int64_t n_rows);
void sample_greedy(const float* logits, int64_t n_vocab, int64_t n_rows, SampledToken* out,
                   void* workspace, unsigned* counters, bool logprobs, cudaStream_t stream);

}  // namespace qwenrt::ops::cuda
