#include "model/weights.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "quant/quant.h"

namespace qwenrt::model {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

enum class Kind { kMatrix, kF32 };  // any supported type, or F32 only (norms, router, conv...)

class Binder {
 public:
  Binder(const gguf::File& file) : file_(file) {}

  Weight get(const std::string& name, std::vector<int64_t> shape, Kind kind) const {
    Weight w = find(name, std::move(shape), kind);
    if (!w.present()) fail("{}: missing tensor '{}'", file_.path(), name);
    return w;
  }

  // Dimensions of a tensor as the file holds it (0 when absent).
  int n_dims(const std::string& name) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    return t ? t->n_dims : 0;
  }

  // Absent is fine; present must be right.
  Weight find(const std::string& name, std::vector<int64_t> shape, Kind kind) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) return {};
    std::vector<int64_t> actual(t->ne.begin(), t->ne.begin() + t->n_dims);
    // Trailing dimensions of 1 are the same shape: converters write some vectors as [n, 1]
    // (ffn_gate_inp_shexp) that llama.cpp's quantizer later writes as [n].
    while (actual.size() > shape.size() && actual.back() == 1) actual.pop_back();
    if (actual != shape) {
      fail("{}: tensor '{}': expected shape {}, got {}", file_.path(), name, shape_string(shape),
           shape_string(actual));
    }
    if (kind == Kind::kF32 && t->dtype != DType::F32) {
      fail("{}: tensor '{}': expected type F32, got {}", file_.path(), name, dtype_name(t->dtype));
    }
    if (!quant::can_dequantize(t->dtype)) {
      fail("{}: tensor '{}': type {} is not supported", file_.path(), name, dtype_name(t->dtype));
    }
    return {name, t->view()};
  }

 private:
  const gguf::File& file_;
};

std::string blk(int il, const char* suffix) {
  return fmt::format("blk.{}.{}", il, suffix);
}

AttentionWeights bind_attention(const Binder& b, const Config& c, int il) {
  const int64_t e = c.n_embd, hd = c.head_dim;
  AttentionWeights w;
  w.qkv =
      b.find(blk(il, "attn_qkv.weight"), {e, (2 * c.n_head + 2 * c.n_head_kv) * hd}, Kind::kMatrix);
  if (!w.qkv.present()) {
    w.q = b.get(blk(il, "attn_q.weight"), {e, 2 * c.n_head * hd}, Kind::kMatrix);
    w.k = b.get(blk(il, "attn_k.weight"), {e, c.n_head_kv * hd}, Kind::kMatrix);
    w.v = b.get(blk(il, "attn_v.weight"), {e, c.n_head_kv * hd}, Kind::kMatrix);
  }
  w.output = b.get(blk(il, "attn_output.weight"), {c.n_head * hd, e}, Kind::kMatrix);
  w.q_norm = b.get(blk(il, "attn_q_norm.weight"), {hd}, Kind::kF32);
  w.k_norm = b.get(blk(il, "attn_k_norm.weight"), {hd}, Kind::kF32);
  return w;
}

DeltaNetWeights bind_deltanet(const Binder& b, const Config& c, int il) {
  const int64_t e = c.n_embd, hv = c.ssm_v_heads, inner = c.ssm_inner;
  DeltaNetWeights w;
  w.qkv = b.get(blk(il, "attn_qkv.weight"), {e, c.conv_channels()}, Kind::kMatrix);
  w.gate = b.get(blk(il, "attn_gate.weight"), {e, inner}, Kind::kMatrix);
  w.conv = b.get(blk(il, "ssm_conv1d.weight"), {c.conv_kernel, c.conv_channels()}, Kind::kF32);
  w.dt_bias = b.get(blk(il, "ssm_dt.bias"), {hv}, Kind::kF32);
  w.a = b.get(blk(il, "ssm_a"), {hv}, Kind::kF32);
  w.beta = b.get(blk(il, "ssm_beta.weight"), {e, hv}, Kind::kMatrix);
  w.alpha = b.get(blk(il, "ssm_alpha.weight"), {e, hv}, Kind::kMatrix);
  w.norm = b.get(blk(il, "ssm_norm.weight"), {c.ssm_head_dim}, Kind::kF32);
  w.output = b.get(blk(il, "ssm_out.weight"), {inner, e}, Kind::kMatrix);
  return w;
}

DenseFfnWeights bind_dense_ffn(const Binder& b, const Config& c, int il) {
  const int64_t e = c.n_embd, ff = c.n_ff;
  return {b.get(blk(il, "ffn_gate.weight"), {e, ff}, Kind::kMatrix),
          b.get(blk(il, "ffn_up.weight"), {e, ff}, Kind::kMatrix),
          b.get(blk(il, "ffn_down.weight"), {ff, e}, Kind::kMatrix)};
}

MoeFfnWeights bind_moe_ffn(const Binder& b, const Config& c, int il) {
  const int64_t e = c.n_embd, ff = c.n_ff_exp, n = c.n_expert, sff = c.n_ff_shexp;
  MoeFfnWeights w;
  w.router = b.get(blk(il, "ffn_gate_inp.weight"), {e, n}, Kind::kF32);
  w.gate_up_exps = b.find(blk(il, "ffn_gate_up_exps.weight"), {e, 2 * ff, n}, Kind::kMatrix);
  if (!w.gate_up_exps.present()) {
    w.gate_exps = b.get(blk(il, "ffn_gate_exps.weight"), {e, ff, n}, Kind::kMatrix);
    w.up_exps = b.get(blk(il, "ffn_up_exps.weight"), {e, ff, n}, Kind::kMatrix);
  }
  w.down_exps = b.get(blk(il, "ffn_down_exps.weight"), {ff, e, n}, Kind::kMatrix);
  w.shared_gate_inp = b.get(blk(il, "ffn_gate_inp_shexp.weight"), {e}, Kind::kF32);
  w.shared_gate = b.get(blk(il, "ffn_gate_shexp.weight"), {e, sff}, Kind::kMatrix);
  w.shared_up = b.get(blk(il, "ffn_up_shexp.weight"), {e, sff}, Kind::kMatrix);
  w.shared_down = b.get(blk(il, "ffn_down_shexp.weight"), {sff, e}, Kind::kMatrix);
  return w;
}

template <class Ffn, class BindFfn>
ModelWeights<Ffn> bind(const gguf::File& file, const Config& c, BindFfn bind_ffn) {
  const Binder b(file);
  ModelWeights<Ffn> w;
  w.token_embd = b.get("token_embd.weight", {c.n_embd, c.n_vocab}, Kind::kMatrix);
  w.output_norm = b.get("output_norm.weight", {c.n_embd}, Kind::kF32);
  w.output = b.find("output.weight", {c.n_embd, c.n_vocab}, Kind::kMatrix);
  if (!w.output.present()) w.output = w.token_embd;  // tied embeddings
  for (int il = 0; il < c.n_layer; ++il) {
    Layer<Ffn> layer;
    layer.attn_norm = b.get(blk(il, "attn_norm.weight"), {c.n_embd}, Kind::kF32);
    layer.post_attn_norm = b.get(blk(il, "post_attention_norm.weight"), {c.n_embd}, Kind::kF32);
    if (c.is_attention_layer(il)) {
      layer.mixer = bind_attention(b, c, il);
    } else {
      layer.mixer = bind_deltanet(b, c, il);
    }
    layer.ffn = bind_ffn(b, c, il);
    w.layers.push_back(std::move(layer));
  }
  const int il = c.n_layer;  // the first MTP block follows the trunk
  if (c.n_layer_nextn > 0) {
    const Weight eh_proj =
        b.find(blk(il, "nextn.eh_proj.weight"), {2 * int64_t{c.n_embd}, c.n_embd}, Kind::kMatrix);
    if (eh_proj.present()) {
      MtpWeights<Ffn> m;
      m.eh_proj = eh_proj;
      m.enorm = b.get(blk(il, "nextn.enorm.weight"), {c.n_embd}, Kind::kF32);
      m.hnorm = b.get(blk(il, "nextn.hnorm.weight"), {c.n_embd}, Kind::kF32);
      m.embed = b.find(blk(il, "nextn.embed_tokens.weight"), {c.n_embd, c.n_vocab}, Kind::kMatrix);
      if (!m.embed.present()) m.embed = w.token_embd;
      m.head_norm = b.find(blk(il, "nextn.shared_head_norm.weight"), {c.n_embd}, Kind::kF32);
      if (!m.head_norm.present()) m.head_norm = w.output_norm;
      m.head =
          b.find(blk(il, "nextn.shared_head_head.weight"), {c.n_embd, c.n_vocab}, Kind::kMatrix);
      if (!m.head.present()) m.head = w.output;
      m.attn_norm = b.get(blk(il, "attn_norm.weight"), {c.n_embd}, Kind::kF32);
      m.post_attn_norm = b.get(blk(il, "post_attention_norm.weight"), {c.n_embd}, Kind::kF32);
      m.attn = bind_attention(b, c, il);
      m.ffn = bind_ffn(b, c, il);
      w.mtp = std::move(m);
    } else {
      log(LogLevel::kInfo, "{}: {} MTP block(s) declared but '{}' is absent; no MTP drafts",
          file.path(), c.n_layer_nextn, blk(il, "nextn.eh_proj.weight"));
    }
  }
  return w;
}

}  // namespace

Qwen35Weights bind_qwen35(const gguf::File& file, const Config& config) {
  return bind<DenseFfnWeights>(file, config, bind_dense_ffn);
}

Qwen35MoeWeights bind_qwen35moe(const gguf::File& file, const Config& config) {
  return bind<MoeFfnWeights>(file, config, bind_moe_ffn);
}

namespace {

// A per-stream gamma: llama.cpp's converter writes [hc * n_embd]; its loader reads it as
// [n_embd, hc]. Either is the same bytes.
Weight grouped_gamma(const Binder& b, const std::string& name, int64_t e, int64_t hc) {
  if (b.n_dims(name) == 2) return b.get(name, {e, hc}, Kind::kF32);
  return b.get(name, {e * hc}, Kind::kF32);
}

HyperConnectionWeights bind_hc(const Binder& b, const Config& c, const std::string& prefix,
                               bool inject) {
  const int64_t e = c.n_embd, hc = c.q4.hc_count, wide = hc * e, lr = c.q4.hc_lowrank;
  HyperConnectionWeights w;
  w.norm = grouped_gamma(b, prefix + "_norm.weight", e, hc);
  w.down = b.get(prefix + "_down.weight", {wide, lr}, Kind::kMatrix);
  w.up = b.get(prefix + "_up.weight", {lr, wide}, Kind::kMatrix);
  if (inject) w.inject = b.get(prefix + "_inject.weight", {wide, hc}, Kind::kMatrix);
  return w;
}

}  // namespace

Qwen4ExpWeights bind_qwen4exp(const gguf::File& file, const Config& c) {
  const Binder b(file);
  const int64_t e = c.n_embd, hc = c.q4.hc_count;
  Qwen4ExpWeights w;
  w.token_embd = b.get("token_embd.weight", {e, c.n_vocab}, Kind::kMatrix);
  w.output = b.find("output.weight", {e, c.n_vocab}, Kind::kMatrix);
  if (!w.output.present()) w.output = w.token_embd;
  w.head = bind_hc(b, c, "output_hc", false);
  if (c.q4.ple_layer >= 0) {
    w.ple_table =
        b.get("per_layer_token_embd.weight", {c.q4.ple_head_dim, c.q4.ple_rows}, Kind::kMatrix);
  }
  for (int il = 0; il < c.n_layer; ++il) {
    Qwen4ExpLayer layer;
    layer.hc_attn = bind_hc(b, c, blk(il, "hc_attn"), true);
    layer.hc_ffn = bind_hc(b, c, blk(il, "hc_ffn"), true);
    if (c.is_attention_layer(il)) {
      layer.mixer = bind_attention(b, c, il);
      if (c.is_qsa_layer(il)) {
        const int64_t d = c.q4.indexer_head_dim;
        layer.indexer.q =
            b.get(blk(il, "indexer.q_proj.weight"), {e, c.q4.indexer_heads * d}, Kind::kMatrix);
        layer.indexer.k = b.get(blk(il, "indexer.k_proj.weight"), {e, d}, Kind::kMatrix);
        layer.indexer.q_norm = b.get(blk(il, "indexer.q_norm.weight"), {d}, Kind::kF32);
        layer.indexer.k_norm = b.get(blk(il, "indexer.k_norm.weight"), {d}, Kind::kF32);
      }
    } else {
      layer.mixer = bind_deltanet(b, c, il);
    }
    if (il == c.q4.ple_layer) {
      const int64_t ple_dim = c.q4.ple_dim();
      PleWeights p;
      p.key = b.get(blk(il, "ple_key.weight"), {ple_dim, hc * e}, Kind::kMatrix);
      p.value = b.get(blk(il, "ple_value.weight"), {ple_dim, e}, Kind::kMatrix);
      p.norm_key = grouped_gamma(b, blk(il, "ple_norm_key.weight"), e, hc);
      p.norm_query = grouped_gamma(b, blk(il, "ple_norm_query.weight"), e, hc);
      p.norm_conv = grouped_gamma(b, blk(il, "ple_norm_conv.weight"), e, hc);
      // F16 in converted files (its rows of conv_kernel are shorter than a quant block).
      p.conv = b.get(blk(il, "ple_conv1d.weight"), {c.q4.ple_conv_kernel, hc * e}, Kind::kMatrix);
      layer.ple = std::move(p);
    }
    layer.ffn = bind_moe_ffn(b, c, il);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

namespace {

void visit(DenseFfnWeights& f, const std::function<void(Weight&)>& fn) {
  for (Weight* w : {&f.gate, &f.up, &f.down}) fn(*w);
}
void visit(MoeFfnWeights& f, const std::function<void(Weight&)>& fn) {
  for (Weight* w : {&f.router, &f.gate_exps, &f.up_exps, &f.gate_up_exps, &f.down_exps,
                    &f.shared_gate_inp, &f.shared_gate, &f.shared_up, &f.shared_down}) {
    if (w->present()) fn(*w);
  }
}
void visit(AttentionWeights& a, const std::function<void(Weight&)>& fn) {
  for (Weight* w : {&a.q, &a.k, &a.v, &a.qkv, &a.output, &a.q_norm, &a.k_norm}) {
    if (w->present()) fn(*w);
  }
}
void visit(DeltaNetWeights& d, const std::function<void(Weight&)>& fn) {
  for (Weight* w :
       {&d.qkv, &d.gate, &d.conv, &d.dt_bias, &d.a, &d.beta, &d.alpha, &d.norm, &d.output}) {
    fn(*w);
  }
}

template <class Ffn>
void visit_model(ModelWeights<Ffn>& m, const std::function<void(Weight&)>& fn) {
  // The MTP block may alias trunk tensors (embed, head): placing is idempotent per tensor, so a
  // backend may see a tensor twice; it keys placement by the source bytes.
  for (Weight* w : {&m.token_embd, &m.output_norm, &m.output}) fn(*w);
  for (auto& layer : m.layers) {
    fn(layer.attn_norm);
    fn(layer.post_attn_norm);
    std::visit([&](auto& mixer) { visit(mixer, fn); }, layer.mixer);
    visit(layer.ffn, fn);
  }
  if (m.mtp) {
    auto& t = *m.mtp;
    for (Weight* w : {&t.eh_proj, &t.enorm, &t.hnorm, &t.embed, &t.head_norm, &t.head, &t.attn_norm,
                      &t.post_attn_norm}) {
      fn(*w);
    }
    visit(t.attn, fn);
    visit(t.ffn, fn);
  }
}

}  // namespace

void for_each_weight(Qwen35Weights& w, const std::function<void(Weight&)>& fn) {
  visit_model(w, fn);
}
void for_each_weight(Qwen35MoeWeights& w, const std::function<void(Weight&)>& fn) {
  visit_model(w, fn);
}

void for_each_weight(Qwen4ExpWeights& m, const std::function<void(Weight&)>& fn) {
  auto hc = [&](HyperConnectionWeights& h) {
    for (Weight* w : {&h.norm, &h.down, &h.up, &h.inject}) {
      if (w->present()) fn(*w);
    }
  };
  fn(m.token_embd);
  fn(m.output);
  hc(m.head);
  for (auto& layer : m.layers) {
    hc(layer.hc_attn);
    hc(layer.hc_ffn);
    std::visit([&](auto& mixer) { visit(mixer, fn); }, layer.mixer);
    for (Weight* w :
         {&layer.indexer.q, &layer.indexer.k, &layer.indexer.q_norm, &layer.indexer.k_norm}) {
      if (w->present()) fn(*w);
    }
    if (layer.ple) {
      auto& p = *layer.ple;
      for (Weight* w : {&p.key, &p.value, &p.norm_key, &p.norm_query, &p.norm_conv, &p.conv}) {
        fn(*w);
      }
    }
    visit(layer.ffn, fn);
  }
}

}  // namespace qwenrt::model
