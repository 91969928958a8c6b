#include "model/pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace qwenrt::model {

Stage whole_trunk(const Config& c) {
  return {.index = 0, .count = 1, .first = 0, .end = c.n_layer};
}

std::vector<Stage> split_layers(const std::vector<int64_t>& layer_bytes, int64_t first_bytes,
                                int64_t last_bytes, int stages) {
  const int n = static_cast<int>(layer_bytes.size());
  if (stages < 1 || stages > n)
    fail("pipeline parallel: {} stages for {} layers (each stage needs a layer)", stages, n);
  // best[s][i]: the least largest stage over splits of layers [0, i) into s stages; cut[s][i]:
  // where the last of them begins. The extras join the first and the last stage's bytes.
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layer_bytes[i];
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, kNone));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= n; ++i) {
      for (int j = s - 1; j < i; ++j) {  // stage s - 1 (0-based) takes layers [j, i)
        if (best[s - 1][j] == kNone) continue;
        int64_t bytes = prefix[i] - prefix[j];
        if (s == 1) bytes += first_bytes;
        if (s == stages && i == n) bytes += last_bytes;
        const int64_t worst = std::max(best[s - 1][j], bytes);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
    }
  }
  std::vector<Stage> out(stages);
  for (int s = stages, i = n; s >= 1; --s) {
    const int j = cut[s][i];
    out[s - 1] = {.index = s - 1, .count = stages, .first = j, .end = i};
    i = j;
  }
  return out;
}

std::vector<Stage> split_layers(const gguf::File& file, const Config& c, int stages) {
  std::vector<int64_t> layers(c.n_layer, 0);
  int64_t first = 0, last = 0;
  for (const auto& t : file.tensors()) {
    const auto bytes = static_cast<int64_t>(t.n_bytes);
    if (t.name.starts_with("blk.")) {
      const int il = std::atoi(t.name.c_str() + 4);
      if (il >= 0 && il < c.n_layer) {
        layers[il] += bytes;
      } else {
        last += bytes;  // an MTP block (a name out of range is refused when the weights bind)
      }
    } else if (t.name.starts_with("token_embd")) {
      first += bytes;
    } else {
      last += bytes;  // output norm and head (and anything else outside the layers)
    }
  }
  return split_layers(layers, first, last, stages);
}

namespace {

template <class Ffn>
void keep(ModelWeights<Ffn>& w, const Stage& s) {
  for (int il = 0; il < static_cast<int>(w.layers.size()); ++il)
    if (il < s.first || il >= s.end) w.layers[il] = {};
  if (!s.is_first()) w.token_embd = {};
  if (!s.is_last()) {
    w.output_norm = {};
    w.output = {};
    w.mtp.reset();
  }
}

}  // namespace

void keep_stage(Qwen35Weights& w, const Stage& stage) {
  keep(w, stage);
}
void keep_stage(Qwen35MoeWeights& w, const Stage& stage) {
  keep(w, stage);
}

}  // namespace qwenrt::model
