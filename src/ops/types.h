// Argument structs shared by the Ops interface and its backends' kernels.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/weight.h"

namespace qwenrt::ops {

// The tensors of one MoE FFN layer (SPEC: MoE FFN). Gate and up come separate or fused.
struct MoeWeights {
  Weight router;           // ffn_gate_inp [n_embd, n_expert] F32
  Weight gate_exps;        // ffn_gate_exps [n_embd, n_ff_exp, n_expert] (absent when fused)
  Weight up_exps;          // ffn_up_exps   [n_embd, n_ff_exp, n_expert] (absent when fused)
  Weight gate_up_exps;     // ffn_gate_up_exps [n_embd, 2 * n_ff_exp, n_expert]: gate rows, then up
  Weight down_exps;        // ffn_down_exps [n_ff_exp, n_embd, n_expert]
  Weight shared_gate_inp;  // ffn_gate_inp_shexp [n_embd] F32: the shared expert's scalar gate
  Weight shared_gate;      // ffn_gate_shexp [n_embd, n_ff_shexp]
  Weight shared_up;        // ffn_up_shexp   [n_embd, n_ff_shexp]
  Weight shared_down;      // ffn_down_shexp [n_ff_shexp, n_embd]
  // Expert parallelism (model/shard.h): the routed tensors hold experts expert_base ..
  // expert_base + ne[2] of the n_expert the router picks among; a picked expert outside them adds
  // nothing here (another rank adds it).
  int expert_base = 0;
};

// One expert's matrices in the order a streamed expert's slot holds them: gate_up, or gate and
// up; then down.
inline std::vector<const Weight*> routed_matrices(const MoeWeights& w) {
  if (w.gate_up_exps.present()) return {&w.gate_up_exps, &w.down_exps};
  return {&w.gate_exps, &w.up_exps, &w.down_exps};
}

// Arguments of the gated delta rule for one sequence of n tokens (SPEC: Gated DeltaNet, step 5).
struct GatedDeltaArgs {
  const float* q;  // [n, Hk, D], L2-normalised, row stride q_stride floats
  const float* k;  // [n, Hk, D], L2-normalised, row stride k_stride floats
  const float* v;  // [n, Hv, D], row stride v_stride floats
  int64_t q_stride, k_stride, v_stride;
  const float* g;     // [n, Hv]: log decay (a * softplus(alpha + dt_bias)), <= 0
  const float* beta;  // [n, Hv]: sigmoid(beta logits)
  float* state;       // [Hv, D (key), D (value)], read and updated
  float* out;         // [n, Hv, D]
  int64_t n;          // tokens
  int n_k_heads;      // Hk; V head h reads K head h % Hk
  int n_v_heads;      // Hv
  int head_dim;       // D
};

// One sequence's rows in a step: rows [begin, begin + count) belong to slot `slot`, which held
// n_past tokens before the step.
struct Span {
  int32_t slot = 0;
  int32_t begin = 0;
  int32_t count = 0;
  int32_t n_past = 0;
  // 1: the DeltaNet ops also write the slot's recurrent state after each row but the last into
  // its history (RecurrentLayer), so a speculative check can keep any prefix of its rows
  // (Engine::rollback). Such a span runs the recurrence token by token, exactly as decode does.
  int32_t keep_states = 0;
};

// How DeltaNet layers run a span of several tokens (one token always runs the recurrence).
enum class DeltaNetMode { kAuto, kRecurrent, kChunked };

// The layout of one step, handed to the backend once per step (Ops::begin_step) and used by every
// op that works per sequence. All arrays are host memory; a device backend uploads them once.
struct StepLayout {
  const int32_t* tokens = nullptr;     // [n]
  const int32_t* positions = nullptr;  // [n]
  int64_t n = 0;
  const Span* spans = nullptr;  // cover rows [0, n) in order, one per slot
  int n_spans = 0;
  const int32_t* output_rows = nullptr;  // rows whose logits (or samples) are wanted, ascending
  int64_t n_output_rows = 0;
  // KV page tables of every slot [n_slots, page_table_stride], pages in token order (token t of a
  // slot is row t % page_size of page table[t / page_size]).
  const int32_t* page_tables = nullptr;
  int64_t page_table_stride = 0;
  DeltaNetMode deltanet_mode = DeltaNetMode::kAuto;
  // The step ends in Ops::sample (not in downloads), so a backend may capture it whole and replay
  // it for later steps of the same shape.
  bool ends_in_sample = false;
  // Some span has keep_states set.
  bool keep_states = false;
  // The step also returns every row's hidden state (ForwardResult::all_hidden): it calls more ops
  // than the same rows without, so a backend that replays steps keeps them apart.
  bool all_hidden = false;
  // The step runs the MTP block (Model::mtp_forward), not the trunk.
  bool mtp_block = false;
};

// The KV pool of one attention layer in backend memory: k and v [n_pages, page_size, kv_dim]
// (kv_dim = n_head_kv * head_dim). Pages are allocated to slots by state::StateStore.
// A QSA layer's pool also holds the indexer's raw keys on the same pages:
// idx [n_pages, page_size, idx_dim].
struct KvLayer {
  float* k = nullptr;
  float* v = nullptr;
  int page_size = 0;
  int64_t kv_dim = 0;
  float* idx = nullptr;
  int64_t idx_dim = 0;
};

// The recurrent state of one DeltaNet layer in backend memory, one block per slot:
// conv [n_slots, K-1, C] (oldest input first), delta [n_slots, Hv, D (key), D (value)].
// The history (history_rows > 0): the state after row r of a keep_states span, r < history_rows,
// conv_history [n_slots, history_rows, K-1, C], delta_history [n_slots, history_rows, Hv, D, D].
// The PLE layer (qwen4exp) adds its own per-slot state: ple_tokens [n_slots, ngram - 1] (the
// last ngram - 1 token ids before the next step, as floats, oldest first) and ple_conv
// [n_slots, (kernel - 1) * dilation, C] (its dilated conv's last inputs, oldest first), with
// histories [n_slots, history_rows, ...] like conv and delta.
struct RecurrentLayer {
  float* conv = nullptr;
  float* delta = nullptr;
  float* conv_history = nullptr;
  float* delta_history = nullptr;
  int history_rows = 0;
  float* ple_tokens = nullptr;
  float* ple_conv = nullptr;
  float* ple_tokens_history = nullptr;
  float* ple_conv_history = nullptr;
};

// Gated attention's core for every span of the step (SPEC: gated attention, after the q/k norms
// and RoPE): writes k, v [n, kv_dim] into each span's pages at positions n_past.., then each
// query row i of a span (at position n_past + i) attends causally over its slot's keys.
struct AttentionArgs {
  const float* q;    // [n, n_head, head_dim], rows q_stride floats apart
  int64_t q_stride;  // floats
  const float* k;    // [n, n_head_kv, head_dim] (contiguous)
  const float* v;    // [n, n_head_kv, head_dim] (contiguous)
  const KvLayer& kv;
  float* out;  // [n, n_head, head_dim]
  int n_head, n_head_kv, head_dim;
  float scale;
};

// The DeltaNet core after the projections, for every span of the step (SPEC: Gated DeltaNet
// steps 2-6): conv1d + SiLU over the fused q|k|v stream with per-slot conv state, split, L2 norm
// of q and k per K head, gates, the gated delta rule with per-slot state, then per V head
// rmsnorm(o, norm) * silu(z) (sigmoid(z) with sigmoid_gate: qwen4exp).
struct DeltaNetArgs {
  const float* qkv;       // [n, C = 2 Hk D + Hv D]: the attn_qkv projection
  const float* z;         // [n, Hv D]: the attn_gate projection
  const float* alpha;     // [n, Hv]: ssm_alpha projection
  const float* beta;      // [n, Hv]: ssm_beta projection
  const Weight& conv;     // ssm_conv1d [K, C] F32
  const Weight& dt_bias;  // [Hv] F32
  const Weight& a;        // [Hv] F32
  const Weight& norm;     // [D] F32
  const RecurrentLayer& state;
  float* out;  // [n, Hv D]
  int n_k_heads, n_v_heads, head_dim;
  float eps;  // rms_eps: the L2 norms' floor and the gated norm's epsilon
  bool sigmoid_gate = false;
};

// Qwen Sparse Attention (qwen4exp) for every span of the step: gated attention's core (as
// AttentionArgs) restricted, per query, to the keys its indexer selects. The indexer's raw keys
// index_k go into the layer's idx pages first. For a query at position p, the complete blocks of
// `ratio` positions in [0, p] get a pooled key: rmsnorm(mean of their raw keys, k_norm), rotated
// (NeoX, n_rot dims) at the block's first position; a block scores
// sum over indexer heads of relu(q_h . key) / sqrt(dim); the budget / ratio best blocks (ties to
// the lower block) plus the incomplete tail are the keys the query attends to. While p + 1 <
// budget + ratio every key is kept: dense attention, exactly.
struct QsaArgs {
  AttentionArgs attn;
  const float* index_q;  // [n, index_heads, index_dim]: after q_norm and RoPE at the positions
  const float* index_k;  // [n, index_dim]: raw
  const Weight& k_norm;  // [index_dim] F32
  int index_heads, index_dim;
  int ratio, budget;
  int n_rot;
  float rope_theta;
  float eps;
};

// The PLE n-gram embedding (qwen4exp) of the step's tokens: per row, the token and its ngram - 1
// predecessors in its sequence (the slot's ple_tokens before the span), each predecessor read as
// `eos` once the window reaches the sequence start or an eos token (the row's own token is never
// cut). For n = 2..ngram, hash_n = XOR_{j < n} ctx[j] * multipliers[j] (uint64), and head
// h = (n - 2) * heads_per_ngram + g reads row hash_n % vocab[h] + offsets[h] of the table.
// out [n, heads * head_dim]: the rows in head order. Updates the slot's ple_tokens.
struct PleEmbedArgs {
  const Weight& table;  // per_layer_token_embd [head_dim, rows]
  int ngram, heads_per_ngram;
  int32_t eos;
  const uint64_t* multipliers;  // [ngram]
  const int64_t* offsets;       // [heads]
  const int64_t* vocab;         // [heads]
  const RecurrentLayer& state;
  float* out;
};

// The PLE layer's causal depthwise conv1d, dilated, + SiLU (qwen4exp), for every span:
// out [n, C] = silu(sum_k kernel[c][k] * input[t - (K - 1 - k) * dilation][c]) over the slot's
// ple_conv history followed by x; updates ple_conv.
struct PleConvArgs {
  const float* x;        // [n, C]
  const Weight& kernel;  // [K, C] (any type quant/ dequantises)
  int dilation;
  const RecurrentLayer& state;
  float* out;
};

// A mapped file holding weights: a weight's data - base is its offset in the file.
struct MappedPart {
  std::string path;
  const uint8_t* base;
  uint64_t size;
};

// Routed experts streamed from the model file into a budgeted cache (the cpu backend).
struct ExpertStreaming {
  std::vector<MappedPart> files;  // the GGUF file, or a split GGUF's parts
  int64_t budget_bytes;           // the cache
  int64_t slot_bytes;             // one expert of one layer (gate + up + down)
  int min_slots;                  // the experts of one token in one layer (expert_used_count)
};

struct ExpertStats {
  int64_t lookups = 0;        // experts the MoE ops asked for
  int64_t hits = 0;           // of those, resident or already loading
  int64_t prefetch_hits = 0;  // of the hits, brought in by a prefetch
  int64_t loads = 0;          // experts read from the file (misses and prefetches)
  int64_t bytes_read = 0;
  int capacity = 0;  // experts the cache holds
};

// Sampling of one output row (sample/sampler.h resolves these from a request; its semantics, in
// ops/ref/sampling.cpp, are the definition every backend follows).
struct SamplingRow {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // 1 = off
  std::span<const std::pair<int32_t, float>> logit_bias;
  std::span<const int32_t> history;  // tokens the penalties count
  double u = 0.0;                    // the uniform draw in [0, 1) that picks the token
  // Whether the caller reads the token's log-probability and the top n_top: when false a backend
  // may skip them (the log-partition is a pass over the whole vocabulary) and leave them 0.
  bool logprobs = true;
};

constexpr int kMaxTopLogprobs = 20;

// A sampled token with the log-probability the model gave it (log-softmax of the raw logits,
// before bias, penalties, temperature and filters) and the top n_top tokens by that measure.
struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;
  int n_top = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

}  // namespace qwenrt::ops
