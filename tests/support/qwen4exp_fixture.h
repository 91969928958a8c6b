// Test support: the committed qwen4exp fixture (tests/fixtures/models/qwen4exp.Q8_0.gguf), its
// prompt, a copy whose QSA keeps every key, and how close two runs' logits are.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/model_files.h"

namespace qwenrt::testing_support {

inline const std::string& qwen4exp_dir() {
  static const std::string dir = std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/models/";
  return dir;
}
inline const std::string& qwen4exp_file() {
  static const std::string file = qwen4exp_dir() + "qwen4exp.Q8_0.gguf";
  return file;
}

// The prompt of the fixtures (manifest.json, shared with the Qwen3.5 ones).
inline std::vector<int32_t> qwen4exp_prompt() {
  std::ifstream in(qwen4exp_dir() + "manifest.json");
  return nlohmann::json::parse(in)["prompt"]["ids"].get<std::vector<int32_t>>();
}

// A copy of the fixture (temporary file `name`) with the indexer budget raised above the prompt:
// QSA keeps every key.
inline std::string qwen4exp_dense_copy(const std::string& name) {
  const std::string p = temp_path(name);
  rewrite(qwen4exp_file(), p, [](auto& kv, auto&, auto&) {
    for (auto& e : kv) {
      if (e.key == "qwen4exp.attention.indexer.top_k") e.value = gguf::Value::u32(256);
    }
  });
  return p;
}

// Row r of logits [rows, vocab].
inline std::vector<float> logits_row(const std::vector<float>& logits, int64_t r, int vocab) {
  return {logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab};
}
inline int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// How close rows of logits are: the worst rel L2 and how many rows agree on the top token.
struct LogitAgreement {
  double worst = 0;
  int top1 = 0, n = 0;
  std::vector<double> errors;  // rel L2 of each row
  std::vector<int> flipped;    // rows whose top token differs
  double widest_flip_gap = 0;  // the largest gap, in want's logits, between want's top token and
                               // ours, over the flipped rows
  void add(const std::vector<float>& mine, const std::vector<float>& want) {
    const double e = rel_l2(mine, want);
    worst = std::max(worst, e);
    errors.push_back(e);
    const int a = argmax(mine), b = argmax(want);
    if (a == b) {
      ++top1;
    } else {
      flipped.push_back(n);
      widest_flip_gap = std::max(widest_flip_gap, double(want[b]) - double(want[a]));
    }
    ++n;
  }
  int rows_above(double tol) const {
    return static_cast<int>(
        std::count_if(errors.begin(), errors.end(), [&](double e) { return e > tol; }));
  }
  // "row: rel L2" of the rows above tol and the rows whose top token flipped, for a failure's
  // message.
  std::string rows_over(double tol) const {
    std::string s;
    for (int r = 0; r < n; ++r) {
      if (errors[r] > tol) s += std::to_string(r) + ": " + std::to_string(errors[r]) + ", ";
    }
    s += "top-1 flipped at rows";
    for (int r : flipped) s += " " + std::to_string(r);
    return s;
  }
};

}  // namespace qwenrt::testing_support
