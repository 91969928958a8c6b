#include "model/config.h"

#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace qwenrt::model {
namespace {

// Reads `{arch}.{name}` from the file; required keys fail when absent.
class KeyReader {
 public:
  KeyReader(const gguf::File& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  std::string key(std::string_view name) const { return arch_ + "." + std::string(name); }

  int get_int(std::string_view name, int64_t min, int64_t max) const {
    auto v = file_.get_int(key(name));
    if (!v) fail("{}: missing metadata key '{}'", file_.path(), key(name));
    return checked(name, *v, min, max);
  }
  int get_int_or(std::string_view name, int fallback, int64_t min, int64_t max) const {
    auto v = file_.get_int(key(name));
    return v ? checked(name, *v, min, max) : fallback;
  }
  float get_float(std::string_view name) const {
    auto v = file_.get_float(key(name));
    if (!v) fail("{}: missing metadata key '{}'", file_.path(), key(name));
    return static_cast<float>(*v);
  }
  const gguf::Array* get_array(std::string_view name) const { return file_.get_array(key(name)); }
  // An integer array of at least min_len entries, each in [min, max]; empty when absent and not
  // required.
  std::vector<int64_t> get_ints(std::string_view name, size_t min_len, int64_t min, int64_t max,
                                bool required) const {
    const gguf::Array* a = get_array(name);
    if (!a) {
      if (required) fail("{}: missing metadata key '{}'", file_.path(), key(name));
      return {};
    }
    if (a->items.size() < min_len) {
      fail("{}: metadata key '{}': expected at least {} entries, got {}", file_.path(), key(name),
           min_len, a->items.size());
    }
    std::vector<int64_t> out;
    for (size_t i = 0; i < a->items.size(); ++i) {
      const auto& item = a->items[i];
      if (!item.is_integer())
        fail("{}: metadata key '{}': expected integers", file_.path(), key(name));
      const bool is_signed = std::holds_alternative<int64_t>(item.data);
      const uint64_t u = is_signed ? 0 : std::get<uint64_t>(item.data);
      const int64_t v = is_signed ? std::get<int64_t>(item.data) : static_cast<int64_t>(u);
      if ((!is_signed && u > static_cast<uint64_t>(max)) || v < min || v > max) {
        fail("{}: metadata key '{}'[{}]: expected a value in [{}, {}], got {}", file_.path(),
             key(name), i, min, max, is_signed ? fmt::format("{}", v) : fmt::format("{}", u));
      }
      out.push_back(v);
    }
    return out;
  }
  const std::string& path() const { return file_.path(); }

 private:
  int checked(std::string_view name, int64_t v, int64_t min, int64_t max) const {
    if (v < min || v > max) {
      fail("{}: metadata key '{}': expected a value in [{}, {}], got {}", file_.path(), key(name),
           min, max, v);
    }
    return static_cast<int>(v);
  }

  const gguf::File& file_;
  std::string arch_;
};

constexpr int64_t kBig = 1 << 24;  // bound for widths and counts: far above any real checkpoint
// PLE table rows: a row id is an int32 (the released table has ~45 million rows per layer).
constexpr int64_t kPleRowLimit = std::numeric_limits<int32_t>::max();

[[noreturn]] void inconsistent(const std::string& path, std::string_view what, int64_t expected,
                               int64_t actual) {
  fail("{}: {}: expected {}, got {}", path, what, expected, actual);
}

// The qwen4exp keys (hyper-connections, QSA, PLE), every one checked against what the forward
// pass relies on.
void read_qwen4exp(const KeyReader& k, Config& c) {
  const std::string& path = k.path();
  Qwen4ExpConfig& q = c.q4;
  q.hc_count = k.get_int("hyper_connection.count", 2, 64);
  q.hc_lowrank = k.get_int("hyper_connection.low_rank", 1, kBig);
  q.indexer_heads = k.get_int("attention.indexer.head_count", 1, 4096);
  q.indexer_head_dim = k.get_int("attention.indexer.key_length", 1, 4096);
  q.indexer_budget = k.get_int("attention.indexer.top_k", 1, std::numeric_limits<int32_t>::max());
  if (q.indexer_head_dim < c.n_rot || q.indexer_head_dim % 2 != 0) {
    fail("{}: {} = {}: the indexer head must be even and hold the {} rotated dims", path,
         k.key("attention.indexer.key_length"), q.indexer_head_dim, c.n_rot);
  }
  const std::vector<int64_t> ratios =
      k.get_ints("attention.compress_ratios", c.n_layer, 0, 1 << 16, true);
  if (ratios.size() < static_cast<size_t>(c.n_layer)) {
    inconsistent(path, k.key("attention.compress_ratios") + " length", c.n_layer, ratios.size());
  }
  bool any = false;
  for (int il = 0; il < c.n_layer; ++il) {
    const int r = static_cast<int>(ratios[il]);
    if (r > 0 && !c.is_attention_layer(il)) {
      fail("{}: {}[{}] = {}: layer {} is a DeltaNet layer, only attention layers compress", path,
           k.key("attention.compress_ratios"), il, r, il);
    }
    if (r > 0 && q.indexer_budget % r != 0) {
      fail("{}: {} = {} is not a multiple of {}[{}] = {}", path, k.key("attention.indexer.top_k"),
           q.indexer_budget, k.key("attention.compress_ratios"), il, r);
    }
    q.compress_ratios.push_back(r);
    any = any || r > 0;
  }
  if (!any) {
    log(LogLevel::kWarn,
        "{}: every entry of '{}' is 0: QSA is off and attention is dense (a converter that read "
        "layer_types through transformers writes this; the released model compresses)",
        path, k.key("attention.compress_ratios"));
  }

  const std::vector<int64_t> ple_layers = k.get_ints("ple.layers", 0, 0, c.n_layer - 1, false);
  if (ple_layers.empty()) return;
  if (ple_layers.size() != 1) {
    fail("{}: metadata key '{}' lists {} layers; one PLE layer is supported", path,
         k.key("ple.layers"), ple_layers.size());
  }
  q.ple_layer = static_cast<int>(ple_layers[0]);
  if (c.is_attention_layer(q.ple_layer)) {
    fail("{}: {}[0] = {}: the PLE layer must be a DeltaNet layer", path, k.key("ple.layers"),
         q.ple_layer);
  }
  q.ple_ngram = k.get_int("ple.ngram_size", 2, 8);
  q.ple_heads_per_ngram = k.get_int("ple.heads_per_ngram", 1, 64);
  q.ple_conv_kernel = k.get_int("ple.conv_kernel", 1, 16);
  q.ple_head_dim = k.get_int("embedding_length_per_layer_input", 1, kBig);
  q.ple_eos = k.get_int("ple.eos_token_id", 0, std::numeric_limits<int32_t>::max());
  const size_t heads = static_cast<size_t>(q.ple_heads());
  const std::vector<int64_t> multipliers = k.get_ints("ple.layer_multipliers", q.ple_ngram, 1,
                                                      std::numeric_limits<int64_t>::max(), true);
  q.ple_multipliers.assign(multipliers.begin(), multipliers.begin() + q.ple_ngram);
  q.ple_head_offsets = k.get_ints("ple.head_offsets", heads, 0, kPleRowLimit, true);
  q.ple_head_vocab = k.get_ints("ple.head_vocab_sizes", heads, 1, kPleRowLimit, true);
  q.ple_head_offsets.resize(heads);
  q.ple_head_vocab.resize(heads);
}

}  // namespace

Config Config::from_gguf(const gguf::File& file) {
  Config c;
  const auto arch = file.get_string("general.architecture");
  if (!arch) fail("{}: missing metadata key 'general.architecture'", file.path());
  if (*arch == "qwen35") {
    c.arch = Arch::kQwen35;
  } else if (*arch == "qwen35moe") {
    c.arch = Arch::kQwen35Moe;
  } else if (*arch == "qwen4exp") {
    c.arch = Arch::kQwen4Exp;
  } else {
    fail("{}: general.architecture: expected 'qwen35', 'qwen35moe' or 'qwen4exp', got '{}'",
         file.path(), gguf::one_line(*arch));
  }
  c.arch_name = *arch;
  const KeyReader k(file, *arch);
  const std::string& path = file.path();

  const int block_count = k.get_int("block_count", 1, 4096);
  c.n_layer_nextn = k.get_int_or("nextn_predict_layers", 0, 0, 16);
  if (c.n_layer_nextn >= block_count) {
    fail("{}: metadata key '{}': {} MTP blocks leave no trunk layers of {} blocks", path,
         k.key("nextn_predict_layers"), c.n_layer_nextn, block_count);
  }
  c.n_layer = block_count - c.n_layer_nextn;
  c.n_ctx_train = k.get_int("context_length", 1, std::numeric_limits<int32_t>::max());
  c.n_embd = k.get_int("embedding_length", 1, kBig);
  c.rms_eps = k.get_float("attention.layer_norm_rms_epsilon");
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) {
    fail("{}: metadata key '{}': expected a value in (0, 1), got {}", path,
         k.key("attention.layer_norm_rms_epsilon"), c.rms_eps);
  }

  c.n_head = k.get_int("attention.head_count", 1, kBig);
  c.n_head_kv = k.get_int("attention.head_count_kv", 1, kBig);
  c.head_dim = k.get_int("attention.key_length", 1, kBig);
  const int value_length = k.get_int_or("attention.value_length", c.head_dim, 1, kBig);
  if (value_length != c.head_dim) {
    inconsistent(path, k.key("attention.value_length") + " (must equal key_length)", c.head_dim,
                 value_length);
  }
  if (c.n_head % c.n_head_kv != 0) {
    fail("{}: {} = {} is not a multiple of {} = {}", path, k.key("attention.head_count"), c.n_head,
         k.key("attention.head_count_kv"), c.n_head_kv);
  }
  c.n_rot = k.get_int("rope.dimension_count", 2, kBig);
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    fail("{}: {} = {}: expected an even number <= head dim {}", path, k.key("rope.dimension_count"),
         c.n_rot, c.head_dim);
  }
  c.rope_theta = k.get_float("rope.freq_base");
  if (!(c.rope_theta > 1))
    fail("{}: {}: expected > 1, got {}", path, k.key("rope.freq_base"), c.rope_theta);
  if (const gguf::Array* sections = k.get_array("rope.dimension_sections")) {
    if (sections->items.size() != 4) {
      inconsistent(path, k.key("rope.dimension_sections") + " length", 4, sections->items.size());
    }
    int sum = 0;
    for (size_t i = 0; i < 4; ++i) {
      const auto& item = sections->items[i];
      if (!item.is_integer())
        fail("{}: {}: expected integers", path, k.key("rope.dimension_sections"));
      const int64_t v = std::holds_alternative<int64_t>(item.data)
                            ? std::get<int64_t>(item.data)
                            : static_cast<int64_t>(std::get<uint64_t>(item.data));
      if (v < 0 || v > c.n_rot)
        fail("{}: {}[{}] = {} is out of range", path, k.key("rope.dimension_sections"), i, v);
      c.rope_sections[i] = static_cast<int>(v);
      sum += c.rope_sections[i];
    }
    // Text positions are equal on every section axis, so the multi-section (IMROPE) rotation is
    // plain NeoX over n_rot dims: what matters is that the sections cover exactly n_rot / 2 pairs.
    if (sum != c.n_rot / 2) {
      inconsistent(path, k.key("rope.dimension_sections") + " sum (rope dims / 2)", c.n_rot / 2,
                   sum);
    }
  }
  c.full_attention_interval = k.get_int_or("full_attention_interval", 4, 1, kBig);
  if (const gguf::Array* rec = k.get_array("attention.recurrent_layers")) {
    if (rec->items.size() < static_cast<size_t>(c.n_layer)) {
      fail("{}: metadata key '{}': expected at least {} entries (one per layer), got {}", path,
           k.key("attention.recurrent_layers"), c.n_layer, rec->items.size());
    }
    for (int il = 0; il < c.n_layer; ++il) {
      const auto& item = rec->items[il];
      if (!std::holds_alternative<bool>(item.data)) {
        fail("{}: metadata key '{}': expected booleans", path, k.key("attention.recurrent_layers"));
      }
      c.recurrent_layers.push_back(std::get<bool>(item.data) ? 1 : 0);
    }
  }

  c.conv_kernel = k.get_int("ssm.conv_kernel", 2, 64);
  c.ssm_head_dim = k.get_int("ssm.state_size", 1, kBig);
  c.ssm_k_heads = k.get_int("ssm.group_count", 1, kBig);
  c.ssm_v_heads = k.get_int("ssm.time_step_rank", 1, kBig);
  c.ssm_inner = k.get_int("ssm.inner_size", 1, kBig);
  if (c.ssm_v_heads % c.ssm_k_heads != 0) {
    fail("{}: {} = {} (V heads) is not a multiple of {} = {} (K heads)", path,
         k.key("ssm.time_step_rank"), c.ssm_v_heads, k.key("ssm.group_count"), c.ssm_k_heads);
  }

  if (c.ssm_inner != int64_t{c.ssm_v_heads} * c.ssm_head_dim) {
    inconsistent(path, k.key("ssm.inner_size") + " (time_step_rank x state_size)",
                 int64_t{c.ssm_v_heads} * c.ssm_head_dim, c.ssm_inner);
  }
  if (c.is_moe()) {
    c.n_expert = k.get_int("expert_count", 1, 1 << 16);
    c.n_expert_used = k.get_int("expert_used_count", 1, 1 << 16);
    if (c.n_expert_used > c.n_expert) {
      fail("{}: {} = {} exceeds {} = {}", path, k.key("expert_used_count"), c.n_expert_used,
           k.key("expert_count"), c.n_expert);
    }
    c.n_ff_exp = k.get_int("expert_feed_forward_length", 1, kBig);
    c.n_ff_shexp = k.get_int_or("expert_shared_feed_forward_length", c.n_ff_exp, 1, kBig);
  } else {
    c.n_ff = k.get_int("feed_forward_length", 1, kBig);
  }

  if (c.is_qwen4exp()) read_qwen4exp(k, c);

  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd) fail("{}: missing tensor 'token_embd.weight'", path);
  if (embd->n_dims != 2 || embd->ne[0] != c.n_embd) {
    fail("{}: tensor 'token_embd.weight': expected shape [{}, n_vocab], got {}", path, c.n_embd,
         embd->shape_string());
  }
  if (embd->ne[1] > kBig)
    fail("{}: tensor 'token_embd.weight': {} rows is too many", path, embd->ne[1]);
  c.n_vocab = static_cast<int>(embd->ne[1]);
  if (c.is_qwen4exp() && c.q4.ple_layer >= 0) {
    const gguf::TensorInfo* t = file.find_tensor("per_layer_token_embd.weight");
    if (!t) fail("{}: missing tensor 'per_layer_token_embd.weight' (the PLE n-gram table)", path);
    if (t->n_dims != 2 || t->ne[0] != c.q4.ple_head_dim) {
      fail("{}: tensor 'per_layer_token_embd.weight': expected shape [{}, rows], got {}", path,
           c.q4.ple_head_dim, t->shape_string());
    }
    c.q4.ple_rows = t->ne[1];
    for (int h = 0; h < c.q4.ple_heads(); ++h) {
      if (c.q4.ple_head_offsets[h] + c.q4.ple_head_vocab[h] > c.q4.ple_rows) {
        fail(
            "{}: metadata keys '{}' / '{}': head {} covers rows [{}, {}) but "
            "'per_layer_token_embd.weight' has {} rows",
            path, k.key("ple.head_offsets"), k.key("ple.head_vocab_sizes"), h,
            c.q4.ple_head_offsets[h], c.q4.ple_head_offsets[h] + c.q4.ple_head_vocab[h],
            c.q4.ple_rows);
      }
    }
  }
  return c;
}

}  // namespace qwenrt::model
