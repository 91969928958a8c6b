// The Ops interface: the operations the forward pass is written in. Activations are fp32 arrays in
// the backend's memory (host memory for ref and cpu, device memory for cuda); the backend owns
// that memory (a workspace reset every step, persistent buffers for sequence state), places the
// weights at load, and keeps everything of a step on its side: MoE routing and sampling included,
// the host only reads logits or sampled tokens at the end.
//
// Shapes are row-major with the last index contiguous: x [n, dim] means n rows of dim floats.
// Weights are GGUF tensors in ggml order ([in, out]: ne[0] = in is contiguous) of any type that
// quant/ supports. Ops that work per sequence (attention, DeltaNet, rope, embed, gather) take the
// rows and spans of the step from the StepLayout given to begin_step: one call covers every
// sequence of the batch. ops/ref defines what every entry computes; fast backends are tested
// against it, and may fuse a block (attention, deltanet, moe) as long as it equals ref's sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "ops/types.h"

namespace qwenrt {
class ThreadPool;
}

namespace qwenrt::ops {

class HostGroup;

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // ---- Memory ----
  // Workspace for one step's activations, valid until reset_workspace(). After a warm-up step
  // of the same shape, a fast backend serves these without allocating.
  virtual float* alloc(int64_t n_floats) = 0;
  virtual void reset_workspace() = 0;
  // A point in the workspace, and giving back everything allocated after it (a layer's
  // temporaries once its output is in place). A backend may keep the memory (the default does).
  virtual int64_t workspace_mark() { return 0; }
  virtual void workspace_release(int64_t mark) { (void)mark; }
  // Persistent backend memory (sequence state, snapshots), zero-filled; freed with free_buffer.
  virtual void* alloc_buffer(int64_t bytes) = 0;
  virtual void free_buffer(void* buffer) = 0;
  // Backend-to-backend copy and zero fill of persistent or workspace memory.
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;
  virtual void fill_zero(void* dst, int64_t bytes) = 0;
  // Host <-> backend copies of fp32 data.
  virtual void upload(const float* host, float* dst, int64_t n) = 0;
  virtual void download(const float* src, float* host, int64_t n) = 0;
  // Places a weight where this backend computes; the returned view is what ops receive. The
  // default uses the mapped file's bytes as they are.
  virtual Weight place(const Weight& w) { return w; }
  // Whether place() copies weights into backend memory (then the engine reports load progress
  // through it instead of prefaulting the mapped file): progress(bytes placed, total). The engine
  // calls set_place_progress before placing weights that lie in a read-only shared file mapping:
  // the backend may then drop its mapping's pages of the weights it copied.
  virtual bool copies_weights() const { return false; }
  virtual void set_place_progress(std::function<void(uint64_t, uint64_t)> progress,
                                  uint64_t total_bytes) {
    (void)progress;
    (void)total_bytes;
  }

  // ---- The step ----
  // The rows, spans, output rows and page tables of the step about to run; kept until the next
  // begin_step (the pointers must stay valid until then).
  virtual void begin_step(const StepLayout& layout) = 0;

  // out [n, dim] = rows tokens[0..n) of table [dim, n_vocab] (the step's tokens).
  virtual void embed(const Weight& table, float* out) = 0;
  // y [n, out] = x [n, in] @ W^T for W [in, out].
  virtual void matmul(const Weight& w, const float* x, float* y, int64_t n) = 0;
  // out [rows, dim] = x / sqrt(mean(x^2) + eps) * weight [dim] (F32 tensor). out may be x.
  virtual void rmsnorm(const float* x, const Weight& weight, float* out, int64_t rows, int64_t dim,
                       float eps) = 0;
  // NeoX rotation (pairs i, i + n_rot/2) of the first n_rot dims of every head at the step's
  // positions, in place. x [n, n_heads, head_dim], rows `token_stride` floats apart.
  virtual void rope_neox(float* x, int n_heads, int head_dim, int64_t token_stride, int n_rot,
                         float theta) = 0;
  // out = silu(gate) * up, n floats (out may alias either).
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out [rows, cols] = x * sigmoid(gate); gate rows are gate_stride floats apart.
  virtual void sigmoid_mul(const float* x, const float* gate, int64_t gate_stride, float* out,
                           int64_t rows, int64_t cols) = 0;
  // out = a + b, n floats (out may alias either).
  virtual void add(const float* a, const float* b, float* out, int64_t n) = 0;
  // dst [rows, cols] (rows dst_stride apart) = src [rows, cols] (rows src_stride apart).
  virtual void copy_2d(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                       int64_t rows, int64_t cols) = 0;
  // out [n_output_rows, dim] = the step's output rows of x [n, dim].
  virtual void gather_output_rows(const float* x, int64_t dim, float* out) = 0;

  // ---- Fusable sequences (ops.cpp defines each as the sequence of the ops above; a backend may
  // run one as fewer kernels) ----
  // x += delta, then out [rows, dim] = rmsnorm(x) (out may not alias x): a residual add and the
  // next block's input norm.
  virtual void add_rmsnorm(float* x, const float* delta, const Weight& weight, float* out,
                           int64_t rows, int64_t dim, float eps);
  // The gated attention's head prologue (SPEC.md "Gated attention"): q_gate [n, n_head, 2 *
  // head_dim] holds each head's query, then its gate. q [n, n_head, head_dim] = rope(rmsnorm(query)
  // * q_norm), gate [n, n_head * head_dim] = the gates, k [n, n_head_kv, head_dim] =
  // rope(rmsnorm(k)
  // * k_norm) in place; NeoX RoPE over the first n_rot dims at the step's positions.
  struct AttentionHeadsArgs {
    const float* q_gate;
    const Weight* q_norm;
    const Weight* k_norm;
    float* q;
    float* gate;
    float* k;
    int64_t n;
    int n_head, n_head_kv, head_dim, n_rot;
    float rope_theta, eps;
  };
  virtual void attention_heads(const AttentionHeadsArgs& a);
  // y_i [n, out_i] = x [n, in] @ W_i^T for several weights of the same `in` (the projections of
  // one block's input).
  struct Projection {
    const Weight* w;
    float* y;
  };
  virtual void matmuls(const float* x, int64_t n, std::span<const Projection> projections);
  // out [n, dim] = down(silu(gate x) * up x): a dense SwiGLU FFN (scratch from the workspace).
  virtual void ffn_swiglu(const Weight& gate, const Weight& up, const Weight& down, const float* x,
                          float* out, int64_t n);

  // ---- Blocks (one call per layer for the whole batch) ----
  virtual void attention(const AttentionArgs& args) = 0;
  // attention(args), then args.out [n, n_head * head_dim] *= sigmoid(gate) (SPEC: the gated
  // attention's output gate; gate rows gate_stride floats apart): the two ops by default.
  virtual void attention_gated(const AttentionArgs& args, const float* gate, int64_t gate_stride,
                               int64_t n);
  virtual void deltanet(const DeltaNetArgs& args) = 0;
  // out [n, dim] = the MoE FFN of x [n, dim] (SPEC: router softmax, top-k renormalised, routed
  // SwiGLU experts, shared expert scaled by sigmoid(shared_gate_inp . x)); routing stays inside.
  virtual void moe(const MoeWeights& w, const float* x, float* out, int64_t n, int n_expert,
                   int k) = 0;
  // The input of a block given as the residual add and norm that make it: x [n, dim] += delta,
  // then h [n, dim] = rmsnorm(x) * norm (add_rmsnorm).
  struct NormedInput {
    float* x;
    const float* delta;
    const Weight* norm;
    float* h;
    int64_t dim;
    float eps;
  };
  // add_rmsnorm of `in`, then moe(w, in.h, out, ...) (ops.cpp): one call so that a backend can
  // fold the norm into its router kernel. in.x and in.h are written either way.
  virtual void add_rmsnorm_moe(const NormedInput& in, const MoeWeights& w, float* out, int64_t n,
                               int n_expert, int k);

  // ---- qwen4exp (Qwen3.8-Flash-Next) ----
  // Host backends run these on the reference kernels; a backend without them fails naming the op.
  // out [rows, groups * dim] = per group g: rmsnorm(x[r, g, :]) * weight[g, :] (weight ggml
  // [dim, groups] F32). out may be x.
  virtual void rmsnorm_grouped(const float* x, const Weight& weight, float* out, int64_t rows,
                               int groups, int64_t dim, float eps);
  // out = silu(scale * x), n floats (out may be x).
  virtual void silu_scaled(const float* x, float scale, float* out, int64_t n);
  // Hyper-connection input mix: out [n, dim] = mean over s < hc of sigmoid(gate[r, s, :]) *
  // xn[r, s, :], for the normed streams xn and mixer logits gate [n, hc, dim].
  virtual void hc_mix(const float* xn, const float* gate, float* out, int64_t n, int hc,
                      int64_t dim);
  // Hyper-connection injection: streams[r, s, :] += block[r, :] * 2 sigmoid(inject[r, s] / hc),
  // streams [n, hc, dim], inject [n, hc] (logits).
  virtual void hc_inject(float* streams, const float* block, const float* inject, int64_t n, int hc,
                         int64_t dim);
  // PLE gate: per stream s, g = (key[r, s, :] . query[r, s, :]) / sqrt(dim), then
  // out[r, s, :] = sigmoid(sign(g) sqrt(max(|g|, 1e-6))) * value[r, :].
  virtual void ple_gate(const float* key, const float* query, const float* value, float* out,
                        int64_t n, int hc, int64_t dim);
  virtual void ple_embed(const PleEmbedArgs& args);
  virtual void ple_conv(const PleConvArgs& args);
  virtual void qsa_attention(const QsaArgs& args);

  // ---- Routed experts streamed from the file ----
  // From now on the MoE ops read routed experts through a cache of the given budget (the cpu
  // backend: host memory; cuda: device memory), called before any weight is placed; Error on a
  // backend without one, or a budget below one token's experts.
  virtual void stream_experts(const ExpertStreaming& config);
  // A hint: the experts the router of w picks for x [n, dim] will be asked for soon (a streaming
  // backend starts reading them). No effect otherwise.
  virtual void moe_prefetch(const MoeWeights& w, const float* x, int64_t n, int n_expert, int k) {
    (void)w, (void)x, (void)n, (void)n_expert, (void)k;
  }
  // Counters of the expert cache (zero without one).
  virtual ExpertStats expert_stats() const { return {}; }
  // Bytes of device memory free for weights (0: this backend's weights stay in host memory);
  // the engine sizes an expert cache from it when none is given.
  virtual int64_t device_memory_free() const { return 0; }

  // ---- Tensor parallelism (model/shard.h) ----
  // Makes this backend rank `rank` of a group whose forward passes run side by side, one thread
  // a rank; Error on a backend that cannot (the default).
  virtual void join_host_group(std::shared_ptr<HostGroup> group, int rank);
  // x [n] = the sum over the group's ranks of their x [n], the same floats on every rank; no-op
  // outside a group.
  virtual void all_reduce_sum(float* x, int64_t n) { (void)x, (void)n; }

  // ---- The end of a step ----
  // Samples one token for each of the step's output rows from logits [n_output_rows, n_vocab]
  // with rows[i]'s settings; out (host) gets the ids, their log-probabilities and the top n_top
  // (<= kMaxTopLogprobs). Error if a row excludes every token.
  virtual void sample(const float* logits, int64_t n_vocab, const SamplingRow* rows, int n_top,
                      SampledToken* out) = 0;
};

// The reference backend (frozen oracle): scalar, one thread, host memory; its workspace is
// poisoned with NaN so an unwritten element shows.
std::unique_ptr<Ops> make_ref_ops();
// The fast CPU backend (ops/cpu): SIMD kernels chosen at run time, `n_threads` threads (0 = the
// physical cores).
std::unique_ptr<Ops> make_cpu_ops(int n_threads = 0);
// The CUDA backend (ops/cuda) on GPU `device`; Error when qwenrt was built without CUDA or the
// device cannot be used.
std::unique_ptr<Ops> make_cuda_ops(int device = 0);
// Whether this build has the CUDA backend and a usable GPU (tests skip without one).
bool cuda_available();
// Why the CUDA backend's kernels cannot run a model with attention heads of `head_dim` and
// DeltaNet heads of `ssm_head_dim` (the backend "auto" then picks cpu), or empty when they can.
std::string cuda_unsupported(int head_dim, int ssm_head_dim);

}  // namespace qwenrt::ops
