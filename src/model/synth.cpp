#include "model/synth.h"

#include <cmath>
#include <random>

#include "core/error.h"
#include "gguf/writer.h"
#include "quant/quant.h"

namespace qwenrt::model {
namespace {

using gguf::Value;

class Filler {
 public:
  Filler(gguf::Writer& w, const SynthSpec& spec) : w_(w), spec_(spec), rng_(spec.seed) {}

  // A matrix [in, out...] of N(0, scale^2) in the spec's matrix type.
  void matrix(const std::string& name, std::vector<int64_t> ne, float scale) {
    add(name, spec_.matrix_type, std::move(ne), [scale](std::mt19937_64& rng, int64_t) {
      return std::normal_distribution<float>(0.0f, scale)(rng);
    });
  }
  // F32 vector/matrix of values from `gen`.
  template <class Gen>
  void f32(const std::string& name, std::vector<int64_t> ne, Gen gen) {
    add(name, DType::F32, std::move(ne), gen);
  }
  void norm(const std::string& name, int64_t n) {
    f32(name, {n}, [](std::mt19937_64& rng, int64_t) {
      return 1.0f + std::uniform_real_distribution<float>(-0.2f, 0.2f)(rng);
    });
  }

 private:
  template <class Gen>
  void add(const std::string& name, DType type, std::vector<int64_t> ne, Gen gen) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    const uint64_t seed = rng_();
    const int64_t row = ne[0];
    w_.add_tensor(name, type, ne, [type, n, row, seed, gen, name](std::span<uint8_t> dst) mutable {
      std::mt19937_64 rng(seed);
      std::vector<float> values(row);
      const size_t row_bytes = dst.size() / (n / row);
      for (int64_t r = 0; r < n / row; ++r) {
        for (int64_t i = 0; i < row; ++i) values[i] = gen(rng, r * row + i);
        quant::quantize(type, values.data(), dst.data() + r * row_bytes, row, name);
      }
    });
  }

  gguf::Writer& w_;
  const SynthSpec& spec_;
  std::mt19937_64 rng_;
};

std::string blk(int il, const char* suffix) {
  return fmt::format("blk.{}.{}", il, suffix);
}

}  // namespace

Config tiny_config(Arch arch) {
  Config c;
  c.arch = arch;
  c.arch_name = arch == Arch::kQwen35 ? "qwen35" : "qwen35moe";
  c.n_layer = 4;
  c.n_ctx_train = 4096;
  c.n_embd = 64;
  c.n_vocab = 96;
  c.rms_eps = 1e-6f;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_rot = 4;
  c.rope_theta = 1e7f;
  c.rope_sections = {1, 1, 0, 0};
  c.full_attention_interval = 4;
  c.conv_kernel = 4;
  c.ssm_head_dim = 16;
  c.ssm_k_heads = 2;
  c.ssm_v_heads = 4;
  c.ssm_inner = 64;
  if (arch == Arch::kQwen35) {
    c.n_ff = 96;
  } else {
    c.n_expert = 6;
    c.n_expert_used = 3;
    c.n_ff_exp = 32;
    c.n_ff_shexp = 48;
  }
  return c;
}

void write_synthetic(const SynthSpec& spec, const std::string& path) {
  const Config& c = spec.config;
  const std::string a = c.arch_name;
  gguf::Writer w;
  w.set("general.architecture", Value::str(a));
  w.set("general.name", Value::str(spec.name));
  auto u32 = [&](const char* key, int64_t v) {
    w.set(a + "." + key, Value::u32(static_cast<uint32_t>(v)));
  };
  u32("block_count", c.n_layer + c.n_layer_nextn);
  u32("context_length", c.n_ctx_train);
  u32("embedding_length", c.n_embd);
  u32("attention.head_count", c.n_head);
  u32("attention.head_count_kv", c.n_head_kv);
  u32("attention.key_length", c.head_dim);
  u32("attention.value_length", c.head_dim);
  w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(c.rms_eps));
  u32("rope.dimension_count", c.n_rot);
  w.set(a + ".rope.freq_base", Value::f32(c.rope_theta));
  std::vector<Value> sections;
  for (int s : c.rope_sections) sections.push_back(Value::i32(s));
  w.set(a + ".rope.dimension_sections", Value::array(gguf::ValueType::INT32, sections));
  u32("full_attention_interval", c.full_attention_interval);
  u32("ssm.conv_kernel", c.conv_kernel);
  u32("ssm.state_size", c.ssm_head_dim);
  u32("ssm.group_count", c.ssm_k_heads);
  u32("ssm.time_step_rank", c.ssm_v_heads);
  u32("ssm.inner_size", c.ssm_inner);
  if (c.is_moe()) {
    u32("expert_count", c.n_expert);
    u32("expert_used_count", c.n_expert_used);
    u32("expert_feed_forward_length", c.n_ff_exp);
    u32("expert_shared_feed_forward_length", c.n_ff_shexp);
  } else {
    u32("feed_forward_length", c.n_ff);
  }

  Filler f(w, spec);
  const int64_t e = c.n_embd;
  auto in_scale = [](int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  f.matrix("token_embd.weight", {e, c.n_vocab}, 1.0f);
  f.norm("output_norm.weight", e);
  if (!spec.tied_output) f.matrix("output.weight", {e, c.n_vocab}, in_scale(e));
  for (int il = 0; il < c.n_layer; ++il) {
    f.norm(blk(il, "attn_norm.weight"), e);
    f.norm(blk(il, "post_attention_norm.weight"), e);
    if (c.is_attention_layer(il)) {
      const int64_t hd = c.head_dim, nq = int64_t{c.n_head} * hd, nkv = int64_t{c.n_head_kv} * hd;
      if (spec.fused_attn_qkv) {
        f.matrix(blk(il, "attn_qkv.weight"), {e, 2 * nq + 2 * nkv}, in_scale(e));
      } else {
        f.matrix(blk(il, "attn_q.weight"), {e, 2 * nq}, in_scale(e));
        f.matrix(blk(il, "attn_k.weight"), {e, nkv}, in_scale(e));
        f.matrix(blk(il, "attn_v.weight"), {e, nkv}, in_scale(e));
      }
      f.matrix(blk(il, "attn_output.weight"), {nq, e}, in_scale(nq));
      f.norm(blk(il, "attn_q_norm.weight"), hd);
      f.norm(blk(il, "attn_k_norm.weight"), hd);
    } else {
      const int64_t hv = c.ssm_v_heads, inner = c.ssm_inner, ch = c.conv_channels();
      f.matrix(blk(il, "attn_qkv.weight"), {e, ch}, in_scale(e));
      f.matrix(blk(il, "attn_gate.weight"), {e, inner}, in_scale(e));
      f.f32(blk(il, "ssm_conv1d.weight"), {c.conv_kernel, ch}, [](std::mt19937_64& rng, int64_t) {
        return std::normal_distribution<float>(0.0f, 0.5f)(rng);
      });
      f.f32(blk(il, "ssm_dt.bias"), {hv}, [](std::mt19937_64& rng, int64_t) {
        return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      });
      f.f32(blk(il, "ssm_a"), {hv}, [](std::mt19937_64& rng, int64_t) {
        return -std::exp(std::uniform_real_distribution<float>(-1.5f, 0.5f)(rng));
      });
      f.matrix(blk(il, "ssm_beta.weight"), {e, hv}, in_scale(e));
      f.matrix(blk(il, "ssm_alpha.weight"), {e, hv}, in_scale(e));
      f.norm(blk(il, "ssm_norm.weight"), c.ssm_head_dim);
      f.matrix(blk(il, "ssm_out.weight"), {inner, e}, in_scale(inner));
    }
    if (c.is_moe()) {
      const int64_t ff = c.n_ff_exp, n = c.n_expert, sff = c.n_ff_shexp;
      f.f32(blk(il, "ffn_gate_inp.weight"), {e, n},
            [s = 4.0f * in_scale(e)](std::mt19937_64& rng, int64_t) {
              return std::normal_distribution<float>(0.0f, s)(rng);
            });
      if (spec.fused_gate_up_exps) {
        f.matrix(blk(il, "ffn_gate_up_exps.weight"), {e, 2 * ff, n}, in_scale(e));
      } else {
        f.matrix(blk(il, "ffn_gate_exps.weight"), {e, ff, n}, in_scale(e));
        f.matrix(blk(il, "ffn_up_exps.weight"), {e, ff, n}, in_scale(e));
      }
      f.matrix(blk(il, "ffn_down_exps.weight"), {ff, e, n}, in_scale(ff));
      f.f32(blk(il, "ffn_gate_inp_shexp.weight"), {e},
            [s = in_scale(e)](std::mt19937_64& rng, int64_t) {
              return std::normal_distribution<float>(0.0f, s)(rng);
            });
      f.matrix(blk(il, "ffn_gate_shexp.weight"), {e, sff}, in_scale(e));
      f.matrix(blk(il, "ffn_up_shexp.weight"), {e, sff}, in_scale(e));
      f.matrix(blk(il, "ffn_down_shexp.weight"), {sff, e}, in_scale(sff));
    } else {
      f.matrix(blk(il, "ffn_gate.weight"), {e, c.n_ff}, in_scale(e));
      f.matrix(blk(il, "ffn_up.weight"), {e, c.n_ff}, in_scale(e));
      f.matrix(blk(il, "ffn_down.weight"), {c.n_ff, e}, in_scale(c.n_ff));
    }
  }
  w.write(path);
}

}  // namespace qwenrt::model
