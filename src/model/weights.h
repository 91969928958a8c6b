// Per-architecture weight structs, bound by tensor name, every type and shape checked.
// Tensors stay in the mapped file (no copy); backends place them where they compute.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/weight.h"
#include "gguf/reader.h"
#include "model/config.h"
#include "ops/types.h"

namespace qwenrt::model {

using qwenrt::Weight;

// Full (gated) attention. attn_q is double width: per head, head_dim query values then
// head_dim gate values. Some files fuse q|k|v into attn_qkv instead.
struct AttentionWeights {
  Weight q;       // attn_q   [n_embd, 2 * n_head * head_dim] (absent when qkv is fused)
  Weight k;       // attn_k   [n_embd, n_head_kv * head_dim]
  Weight v;       // attn_v   [n_embd, n_head_kv * head_dim]
  Weight qkv;     // attn_qkv [n_embd, (2 * n_head + 2 * n_head_kv) * head_dim] (fused files only)
  Weight output;  // attn_output [n_head * head_dim, n_embd]
  Weight q_norm;  // attn_q_norm [head_dim] F32
  Weight k_norm;  // attn_k_norm [head_dim] F32
};

struct DeltaNetWeights {
  Weight qkv;      // attn_qkv   [n_embd, conv_channels]: q (Hk*D) | k (Hk*D) | v (Hv*D)
  Weight gate;     // attn_gate  [n_embd, Hv*D]: z, the output gate
  Weight conv;     // ssm_conv1d [conv_kernel, conv_channels] F32
  Weight dt_bias;  // ssm_dt.bias [Hv] F32
  Weight a;        // ssm_a [Hv] F32, already -exp(A_log)
  Weight beta;     // ssm_beta  [n_embd, Hv]
  Weight alpha;    // ssm_alpha [n_embd, Hv]
  Weight norm;     // ssm_norm [D] F32
  Weight output;   // ssm_out [Hv*D, n_embd]
};

struct DenseFfnWeights {
  Weight gate;  // ffn_gate [n_embd, n_ff]
  Weight up;    // ffn_up   [n_embd, n_ff]
  Weight down;  // ffn_down [n_ff, n_embd]
};

// The MoE tensors are an ops-level struct: the backends' MoE kernels take them whole.
using MoeFfnWeights = ops::MoeWeights;

template <class Ffn>
struct Layer {
  Weight attn_norm;       // attn_norm [n_embd] F32
  Weight post_attn_norm;  // post_attention_norm [n_embd] F32
  std::variant<DeltaNetWeights, AttentionWeights> mixer;
  Ffn ffn;
};

// The MTP (nextn) block stored as blk.{n_layer}: x = eh_proj [enorm(embed(t+1)); hnorm(h_t)],
// then one gated-attention layer with its own KV and the model's FFN kind, then the head.
template <class Ffn>
struct MtpWeights {
  Weight eh_proj;    // nextn.eh_proj [2 * n_embd, n_embd]: embedding half first
  Weight enorm;      // nextn.enorm [n_embd] F32
  Weight hnorm;      // nextn.hnorm [n_embd] F32
  Weight embed;      // nextn.embed_tokens, else token_embd
  Weight head_norm;  // nextn.shared_head_norm, else output_norm
  Weight head;       // nextn.shared_head_head, else the model's output head
  Weight attn_norm;
  Weight post_attn_norm;
  AttentionWeights attn;
  Ffn ffn;
};

template <class Ffn>
struct ModelWeights {
  Weight token_embd;   // [n_embd, n_vocab]
  Weight output_norm;  // [n_embd] F32
  Weight output;       // [n_embd, n_vocab]; token_embd when the file has no output.weight
  std::vector<Layer<Ffn>> layers;
  std::optional<MtpWeights<Ffn>> mtp;  // when the file has the MTP block
};

using Qwen35Weights = ModelWeights<DenseFfnWeights>;
using Qwen35MoeWeights = ModelWeights<MoeFfnWeights>;

// ---- qwen4exp (Qwen3.8-Flash-Next) ----

// A hyper-connection module: the grouped norm of the hc residual streams, the low-rank input
// mixer and (except in the final mixer) the per-stream injection weights. The norm gammas are
// stored folded to (1 + w).
struct HyperConnectionWeights {
  Weight norm;    // hc_*_norm [n_embd, hc] or [hc * n_embd] F32: one gamma row per stream
  Weight down;    // hc_*_down [hc * n_embd, lowrank]
  Weight up;      // hc_*_up   [lowrank, hc * n_embd]
  Weight inject;  // hc_*_inject [hc * n_embd, hc] (absent in the final mixer)
};

// The QSA indexer of an attention layer (one key head; its keys are cached raw).
struct IndexerWeights {
  Weight q;       // indexer.q_proj [n_embd, indexer_heads * indexer_head_dim]
  Weight k;       // indexer.k_proj [n_embd, indexer_head_dim]
  Weight q_norm;  // indexer.q_norm [indexer_head_dim] F32 (folded 1 + w)
  Weight k_norm;  // indexer.k_norm [indexer_head_dim] F32 (folded 1 + w)
};

// The PLE layer's own tensors (the n-gram table is the model's per_layer_token_embd).
struct PleWeights {
  Weight key;         // ple_key   [ple_dim, hc * n_embd]
  Weight value;       // ple_value [ple_dim, n_embd]
  Weight norm_key;    // ple_norm_key   [n_embd, hc] F32
  Weight norm_query;  // ple_norm_query [n_embd, hc] F32
  Weight norm_conv;   // ple_norm_conv  [n_embd, hc] F32
  Weight conv;        // ple_conv1d [conv_kernel, hc * n_embd] (F16 as converted)
};

struct Qwen4ExpLayer {
  HyperConnectionWeights hc_attn;  // before the token mixer
  HyperConnectionWeights hc_ffn;   // before the MoE
  std::variant<DeltaNetWeights, AttentionWeights> mixer;
  IndexerWeights indexer;         // QSA attention layers only
  std::optional<PleWeights> ple;  // the PLE layer only
  MoeFfnWeights ffn;
};

struct Qwen4ExpWeights {
  Weight token_embd;            // [n_embd, n_vocab]
  Weight output;                // [n_embd, n_vocab]; token_embd when absent
  Weight ple_table;             // per_layer_token_embd [ple_head_dim, ple_rows] (PLE files only)
  HyperConnectionWeights head;  // output_hc_norm / _down / _up: the final mixer (no output_norm)
  std::vector<Qwen4ExpLayer> layers;
};

// Binds and checks every trunk tensor, and the first MTP block when the file declares and holds
// one. Error: "<file>: tensor 'blk.3.attn_q.weight': expected shape [256, 1024], got [256, 512]".
Qwen35Weights bind_qwen35(const gguf::File& file, const Config& config);
Qwen35MoeWeights bind_qwen35moe(const gguf::File& file, const Config& config);
Qwen4ExpWeights bind_qwen4exp(const gguf::File& file, const Config& config);

// Calls fn on every tensor the model holds (to place them on a backend).
void for_each_weight(Qwen35Weights& w, const std::function<void(Weight&)>& fn);
void for_each_weight(Qwen35MoeWeights& w, const std::function<void(Weight&)>& fn);
// Every tensor but the PLE table, which stays in the mapped file: its rows are read on demand.
void for_each_weight(Qwen4ExpWeights& w, const std::function<void(Weight&)>& fn);

}  // namespace qwenrt::model
