// Test support: tiny synthetic model files and GGUF rewriting (drop, replace or add tensors and
// keys) to make malformed-but-parseable models.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/synth.h"

namespace qwenrt::testing_support {

// This process's own temporary folder: ctest runs tests as parallel processes, so two tests
// writing the same file name must not meet. It is made new (mkdtemp), never a folder a process
// with the same id left behind, and removed when the process ends.
inline const std::string& temp_dir() {
  struct Dir {
    std::string path;
    Dir() {
      std::string pattern = ::testing::TempDir() + "/qwenrt-test-XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr)
        throw std::runtime_error("cannot make a temporary folder from " + pattern);
      path = pattern;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// A path in temp_dir().
inline std::string temp_path(const std::string& name) {
  return temp_dir() + "/" + name;
}

inline std::string write_tiny(model::Arch arch, const std::string& name,
                              std::function<void(model::SynthSpec&)> edit = nullptr) {
  model::SynthSpec spec;
  spec.config = model::tiny_config(arch);
  spec.seed = arch == model::Arch::kQwen35 ? 11 : 12;
  if (edit) edit(spec);
  const std::string path = temp_path(name);
  model::write_synthetic(spec, path);
  return path;
}

struct TensorData {
  DType dtype;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
};

// Copies `src` to `dst`, letting `edit` change the metadata and the tensors first.
inline void rewrite(
    const std::string& src, const std::string& dst,
    const std::function<void(std::vector<gguf::KeyValue>&, std::map<std::string, TensorData>&,
                             std::vector<std::string>& order)>& edit) {
  // A split GGUF's part is rewritten alone (its own keys and tensors).
  gguf::File f = gguf::File::open(src, {.single_part = true}).value();
  std::vector<gguf::KeyValue> kv = f.metadata();
  std::map<std::string, TensorData> tensors;
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) {
    tensors[t.name] = {t.dtype, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                       std::vector<uint8_t>(t.data, t.data + t.n_bytes)};
    order.push_back(t.name);
  }
  edit(kv, tensors, order);
  gguf::Writer w;
  for (auto& [key, value] : kv) w.set(key, value);
  for (const auto& name : order) {
    auto it = tensors.find(name);
    if (it == tensors.end()) continue;
    w.add_tensor(name, it->second.dtype, it->second.ne, it->second.bytes);
  }
  w.write(dst);
}

// n token ids drawn uniformly from [0, n_vocab), seeded.
inline std::vector<int32_t> random_tokens(int n, int n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % n_vocab);
  return ids;
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace qwenrt::testing_support
