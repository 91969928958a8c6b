#include "model/shard.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "quant/quant.h"

namespace qwenrt::model {

HeadShare share_heads(const Config& c, Shard s) {
  const int n = s.size, r = s.rank;
  if (n < 1 || r < 0 || r >= n) fail("tensor parallel: rank {} of {}", r, n);
  HeadShare h;
  if (c.n_head > 0) {
    if (c.n_head % n != 0)
      fail("tensor parallel: {} attention heads do not divide over {} ranks", c.n_head, n);
    const int q = c.n_head / n, group = c.n_head / c.n_head_kv;
    for (int i = 0; i < q; ++i) h.q.push_back(r * q + i);
    if (c.n_head_kv % n == 0) {
      const int kv = c.n_head_kv / n;
      for (int i = 0; i < kv; ++i) h.kv.push_back(r * kv + i);
    } else if (n % c.n_head_kv == 0) {
      h.kv.push_back(r * q / group);  // the rank's query heads all read this one
    } else {
      fail("tensor parallel: {} KV heads neither divide over {} ranks nor divide them", c.n_head_kv,
           n);
    }
  }
  if (c.ssm_k_heads > 0) {
    const int hk = c.ssm_k_heads, ratio = c.ssm_v_heads / c.ssm_k_heads;
    if (hk % n == 0) {
      const int k = hk / n, a = r * k;
      for (int i = 0; i < k; ++i) h.k.push_back(a + i);
      for (int m = 0; m < ratio; ++m)
        for (int i = 0; i < k; ++i) h.v.push_back(m * hk + a + i);
    } else if (n % hk == 0 && ratio % (n / hk) == 0) {
      const int share = n / hk, i = r / share, j = r % share, per = ratio / share;
      h.k.push_back(i);
      for (int m = j * per; m < (j + 1) * per; ++m) h.v.push_back(m * hk + i);
    } else {
      fail("tensor parallel: DeltaNet's {} K / {} V heads cannot be shared over {} ranks", hk,
           c.ssm_v_heads, n);
    }
  }
  return h;
}

Range width_part(int64_t width, Shard s) {
  if (s.size < 1 || s.rank < 0 || s.rank >= s.size)
    fail("tensor parallel: rank {} of {}", s.rank, s.size);
  if (width < s.size)
    fail("tensor parallel: a hidden width of {} columns cannot be split over {} ranks", width,
         s.size);
  int64_t unit = 1;
  for (int64_t u : {256, 32}) {
    if (width % u == 0 && width / u >= s.size) {
      unit = u;
      break;
    }
  }
  const int64_t units = width / unit, first = units * s.rank / s.size,
                end = units * (s.rank + 1) / s.size;
  return {first * unit, (end - first) * unit};
}

Config shard_config(const Config& c, Shard s) {
  const HeadShare h = share_heads(c, s);
  Config local = c;
  local.n_head = static_cast<int>(h.q.size());
  local.n_head_kv = static_cast<int>(h.kv.size());
  local.ssm_k_heads = static_cast<int>(h.k.size());
  local.ssm_v_heads = static_cast<int>(h.v.size());
  local.ssm_inner = local.ssm_v_heads * c.ssm_head_dim;
  // A MoE model's n_ff is not a matrix's width (its FFNs are experts): it stays as it is.
  if (c.n_ff > 0 && !c.is_moe()) local.n_ff = static_cast<int>(width_part(c.n_ff, s).count);
  if (c.n_ff_shexp > 0) local.n_ff_shexp = static_cast<int>(width_part(c.n_ff_shexp, s).count);
  if (c.is_moe() && !s.expert_parallel)
    local.n_ff_exp = static_cast<int>(width_part(c.n_ff_exp, s).count);
  return local;
}

VocabRange vocab_range(const Config& c, Shard s) {
  return {int64_t{c.n_vocab} * s.rank / s.size, int64_t{c.n_vocab} * (s.rank + 1) / s.size};
}

int64_t head_rows_on_rank(const Config& c, Shard s, int64_t rows) {
  const VocabRange v = vocab_range(c, s);
  return std::clamp<int64_t>(rows - v.begin, 0, v.end - v.begin);
}

void ShardArena::copied(const void* source, int64_t bytes) const {
  if (sources_mapped_) drop_mapped_pages(source, bytes);
}

void* ShardArena::alloc(size_t bytes) {
  blocks_.push_back(std::make_unique<uint8_t[]>(bytes));
  return blocks_.back().get();
}

void ShardArena::keep_only(const std::vector<const void*>& in_use) {
  std::erase_if(blocks_, [&](const std::unique_ptr<uint8_t[]>& b) {
    return std::find(in_use.begin(), in_use.end(), b.get()) == in_use.end();
  });
}

namespace {

// A copy's shape: rows and columns selected from a matrix, in its type where every column range
// falls on its blocks, else in F32.
struct Cut {
  DType type;
  int64_t n_rows = 0, n_cols = 0, bytes = 0;
};

Cut plan_cut(const TensorView& v, const std::vector<Range>& rows, const std::vector<Range>& cols,
             const std::string& name) {
  Cut c;
  for (const Range& r : rows) {
    if (r.begin < 0 || r.count < 0 || r.begin + r.count > v.ne[1])
      fail("shard: rows {}..{} of '{}' ({} rows)", r.begin, r.begin + r.count, name, v.ne[1]);
    c.n_rows += r.count;
  }
  bool on_blocks = true;
  const auto& t = traits(v.dtype);
  for (const Range& col : cols) {
    if (col.begin < 0 || col.count < 0 || col.begin + col.count > v.ne[0])
      fail("shard: columns {}..{} of '{}' ({} columns)", col.begin, col.begin + col.count, name,
           v.ne[0]);
    c.n_cols += col.count;
    on_blocks = on_blocks && col.begin % t.block_elems == 0 && col.count % t.block_elems == 0;
  }
  c.type = on_blocks ? v.dtype : DType::F32;
  const auto& tt = traits(c.type);
  c.bytes = c.n_cols / tt.block_elems * tt.block_bytes * c.n_rows;
  return c;
}

void copy_cut(const TensorView& v, const std::vector<Range>& rows, const std::vector<Range>& cols,
              const Cut& c, const std::string& name, uint8_t* dst) {
  const auto& t = traits(v.dtype);
  const auto& tt = traits(c.type);
  const bool on_blocks = c.type == v.dtype;
  std::vector<float> row(on_blocks ? 0 : v.ne[0]);
  for (const Range& r : rows) {
    for (int64_t i = r.begin; i < r.begin + r.count; ++i) {
      const uint8_t* src = v.row(i);
      if (!on_blocks) quant::dequantize(v.dtype, src, row.data(), v.ne[0], name);
      for (const Range& col : cols) {
        const int64_t bytes = col.count / tt.block_elems * tt.block_bytes;
        if (on_blocks) {
          std::memcpy(dst, src + col.begin / t.block_elems * t.block_bytes, bytes);
        } else {
          std::memcpy(dst, row.data() + col.begin, bytes);
        }
        dst += bytes;
      }
    }
  }
}

}  // namespace

Weight take(const Weight& w, const std::vector<Range>& rows, const std::vector<Range>& cols,
            ShardArena& arena) {
  const TensorView& v = w.view;
  if (v.ne[2] != 1 || v.ne[3] != 1) fail("shard: '{}' is not a matrix", w.name);
  const std::vector<Range> all_cols = {{0, v.ne[0]}};
  const Cut c = plan_cut(v, rows, cols.empty() ? all_cols : cols, w.name);
  Weight out = w;
  if (rows.size() == 1 && cols.empty()) {  // a view of the file's bytes
    out.view.data = v.row(rows[0].begin);
    out.view.ne[1] = rows[0].count;
    out.view.nb[2] = out.view.nb[3] = v.nb[1] * rows[0].count;
    return out;
  }
  auto* dst = static_cast<uint8_t*>(arena.alloc(static_cast<size_t>(c.bytes)));
  copy_cut(v, rows, cols.empty() ? all_cols : cols, c, w.name, dst);
  arena.copied(v.data, v.ne[1] * v.nb[1]);
  out.view = TensorView::contiguous(c.type, v.n_dims, {c.n_cols, c.n_rows, 1, 1}, dst);
  return out;
}

Weight take_experts(const Weight& w, const std::vector<Range>& rows, const std::vector<Range>& cols,
                    ShardArena& arena) {
  const TensorView& v = w.view;
  const int64_t n_expert = v.ne[2];
  if (v.ne[3] != 1) fail("shard: '{}' is not a stack of expert matrices", w.name);
  const std::vector<Range> all_rows = {{0, v.ne[1]}}, all_cols = {{0, v.ne[0]}};
  const std::vector<Range>& rs = rows.empty() ? all_rows : rows;
  const std::vector<Range>& cs = cols.empty() ? all_cols : cols;
  const Cut c = plan_cut(w.expert_view(0), rs, cs, w.name);
  auto* dst = static_cast<uint8_t*>(arena.alloc(static_cast<size_t>(c.bytes * n_expert)));
  for (int64_t e = 0; e < n_expert; ++e) {
    copy_cut(w.expert_view(e), rs, cs, c, w.name, dst + e * c.bytes);
    arena.copied(w.expert_view(e).data, v.ne[1] * v.nb[1]);
  }
  Weight out = w;
  out.view = TensorView::contiguous(c.type, 3, {c.n_cols, c.n_rows, n_expert, 1}, dst);
  return out;
}

namespace {

// The ranges of rows (or columns) that heads `ids` cover, `width` each, after `offset`.
std::vector<Range> head_ranges(const std::vector<int>& ids, int64_t width, int64_t offset = 0) {
  std::vector<Range> out;
  for (int id : ids) {
    const int64_t begin = offset + id * width;
    if (!out.empty() && out.back().begin + out.back().count == begin) {
      out.back().count += width;
    } else {
      out.push_back({begin, width});
    }
  }
  return out;
}

std::vector<Range> concat(std::vector<Range> a, const std::vector<Range>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<Range> every_row(const Weight& w) {
  return {{0, w.view.ne[1]}};
}

AttentionWeights shard_attention(const AttentionWeights& f, const Config& c, const HeadShare& h,
                                 ShardArena& a) {
  const int64_t hd = c.head_dim, nq = int64_t{c.n_head} * hd, nkv = int64_t{c.n_head_kv} * hd;
  AttentionWeights w = f;
  if (f.qkv.present()) {
    w.qkv = take(f.qkv,
                 concat(concat(head_ranges(h.q, 2 * hd), head_ranges(h.kv, hd, 2 * nq)),
                        head_ranges(h.kv, hd, 2 * nq + nkv)),
                 {}, a);
  } else {
    w.q = take(f.q, head_ranges(h.q, 2 * hd), {}, a);
    w.k = take(f.k, head_ranges(h.kv, hd), {}, a);
    w.v = take(f.v, head_ranges(h.kv, hd), {}, a);
  }
  w.output = take(f.output, every_row(f.output), head_ranges(h.q, hd), a);
  return w;
}

DeltaNetWeights shard_deltanet(const DeltaNetWeights& f, const Config& c, const HeadShare& h,
                               ShardArena& a) {
  const int64_t d = c.ssm_head_dim, nk = int64_t{c.ssm_k_heads} * d;
  const std::vector<Range> channels =
      concat(concat(head_ranges(h.k, d), head_ranges(h.k, d, nk)), head_ranges(h.v, d, 2 * nk));
  DeltaNetWeights w = f;
  w.qkv = take(f.qkv, channels, {}, a);
  w.conv = take(f.conv, channels, {}, a);
  w.gate = take(f.gate, head_ranges(h.v, d), {}, a);
  w.alpha = take(f.alpha, head_ranges(h.v, 1), {}, a);
  w.beta = take(f.beta, head_ranges(h.v, 1), {}, a);
  w.dt_bias = take(f.dt_bias, {{0, 1}}, head_ranges(h.v, 1), a);
  w.a = take(f.a, {{0, 1}}, head_ranges(h.v, 1), a);
  w.output = take(f.output, every_row(f.output), head_ranges(h.v, d), a);
  return w;
}

// A SwiGLU's slice of its hidden width: gate and up rows, down columns.
void shard_swiglu(const Weight& gate, const Weight& up, const Weight& down, Shard s, ShardArena& a,
                  Weight& g, Weight& u, Weight& dn) {
  const int64_t ff = gate.view.ne[1];
  if (ff < s.size)
    fail("tensor parallel: '{}' is {} wide, narrower than {} ranks", gate.name, ff, s.size);
  const Range part = width_part(ff, s);
  g = take(gate, {part}, {}, a);
  u = take(up, {part}, {}, a);
  dn = take(down, every_row(down), {part}, a);
}

DenseFfnWeights shard_ffn(const DenseFfnWeights& f, const Config&, Shard s, ShardArena& a) {
  DenseFfnWeights w;
  shard_swiglu(f.gate, f.up, f.down, s, a, w.gate, w.up, w.down);
  return w;
}

// Routed experts: the rank's experts (expert parallelism: views of the file), or a slice of
// every expert's width (copies); the shared expert split by its hidden width.
MoeFfnWeights shard_ffn(const MoeFfnWeights& f, const Config& c, Shard s, ShardArena& a) {
  MoeFfnWeights w = f;
  if (s.expert_parallel) {
    if (c.n_expert % s.size != 0)
      fail("tensor parallel: {} experts do not divide over {} ranks", c.n_expert, s.size);
    const int64_t per = c.n_expert / s.size, first = per * s.rank;
    for (Weight* e : {&w.gate_exps, &w.up_exps, &w.gate_up_exps, &w.down_exps}) {
      if (!e->present()) continue;
      TensorView& v = e->view;
      v.data = static_cast<const uint8_t*>(v.data) + first * v.nb[2];
      v.ne[2] = per;
      v.nb[3] = v.nb[2] * per;
    }
    w.expert_base = static_cast<int>(first);
  } else {
    const int64_t ff = f.down_exps.view.ne[0];
    const Range part = width_part(ff, s);
    if (f.gate_up_exps.present()) {  // gate rows, then up rows
      w.gate_up_exps = take_experts(f.gate_up_exps, {part, {ff + part.begin, part.count}}, {}, a);
    } else {
      w.gate_exps = take_experts(f.gate_exps, {part}, {}, a);
      w.up_exps = take_experts(f.up_exps, {part}, {}, a);
    }
    w.down_exps = take_experts(f.down_exps, {}, {part}, a);
    w.expert_base = 0;
  }
  if (f.shared_down.present())
    shard_swiglu(f.shared_gate, f.shared_up, f.shared_down, s, a, w.shared_gate, w.shared_up,
                 w.shared_down);
  return w;
}

template <class Ffn>
ModelWeights<Ffn> shard_model(const ModelWeights<Ffn>& f, const Config& c, Shard s, ShardArena& a) {
  const HeadShare h = share_heads(c, s);
  const VocabRange vocab = vocab_range(c, s);
  const Range head_rows{vocab.begin, vocab.end - vocab.begin};
  ModelWeights<Ffn> w;
  w.token_embd = f.token_embd;  // every rank embeds its step's tokens
  w.output_norm = f.output_norm;
  // Under pipeline parallelism too (model/pipeline.h), the weights off the rank's stage are
  // absent: they stay so.
  w.output = f.output.present() ? take(f.output, {head_rows}, {}, a) : f.output;
  for (const auto& fl : f.layers) {
    Layer<Ffn> l;
    if (!fl.attn_norm.present()) {
      w.layers.push_back(std::move(l));
      continue;
    }
    l.attn_norm = fl.attn_norm;
    l.post_attn_norm = fl.post_attn_norm;
    if (const auto* attn = std::get_if<AttentionWeights>(&fl.mixer)) {
      l.mixer = shard_attention(*attn, c, h, a);
    } else {
      l.mixer = shard_deltanet(std::get<DeltaNetWeights>(fl.mixer), c, h, a);
    }
    l.ffn = shard_ffn(fl.ffn, c, s, a);
    w.layers.push_back(std::move(l));
  }
  if (f.mtp) {
    MtpWeights<Ffn> m = *f.mtp;  // eh_proj, norms and embedding replicated
    m.head = f.mtp->head.view.data == f.output.view.data ? w.output
                                                         : take(f.mtp->head, {head_rows}, {}, a);
    m.attn = shard_attention(f.mtp->attn, c, h, a);
    m.ffn = shard_ffn(f.mtp->ffn, c, s, a);
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace

Qwen35Weights shard_weights(const Qwen35Weights& full, const Config& c, Shard shard,
                            ShardArena& arena) {
  return shard_model(full, c, shard, arena);
}

Qwen35MoeWeights shard_weights(const Qwen35MoeWeights& full, const Config& c, Shard shard,
                               ShardArena& arena) {
  return shard_model(full, c, shard, arena);
}

}  // namespace qwenrt::model
