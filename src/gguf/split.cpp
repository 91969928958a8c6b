#include "gguf/split.h"

#include <cstring>

#include "core/error.h"
#include "gguf/writer.h"

namespace qwenrt::gguf {

std::vector<std::string> write_split(const File& file, const std::string& prefix,
                                     const SplitLimits& limits) {
  if (limits.max_part_bytes == 0 || limits.max_part_tensors == 0)
    fail("write_split: a part must hold at least one byte and one tensor");
  // Tensors to parts, in order.
  std::vector<std::vector<const TensorInfo*>> parts(1);
  uint64_t bytes = 0;
  for (const auto& t : file.tensors()) {
    auto& part = parts.back();
    if (!part.empty() &&
        (bytes + t.n_bytes > limits.max_part_bytes || part.size() >= limits.max_part_tensors)) {
      parts.emplace_back();
      bytes = 0;
    }
    parts.back().push_back(&t);
    bytes += t.n_bytes;
  }
  const auto count = static_cast<uint64_t>(parts.size());
  if (count > 65535) fail("write_split: {} parts do not fit split.count (u16)", count);
  std::vector<std::string> paths;
  for (uint64_t i = 0; i < count; ++i) {
    Writer w(static_cast<uint32_t>(file.alignment()));
    if (i == 0) {
      for (const auto& kv : file.metadata()) {
        if (!kv.key.starts_with("split.")) w.set(kv.key, kv.value);
      }
    }
    w.set("split.no", Value::u16(static_cast<uint16_t>(i)));
    w.set("split.count", Value::u16(static_cast<uint16_t>(count)));
    w.set("split.tensors.count", Value::i32(static_cast<int32_t>(file.tensors().size())));
    for (const TensorInfo* t : parts[i]) {
      w.add_tensor(t->name, t->dtype,
                   std::vector<int64_t>(t->ne.begin(), t->ne.begin() + t->n_dims),
                   [t](std::span<uint8_t> dst) { std::memcpy(dst.data(), t->data, dst.size()); });
    }
    paths.push_back(SplitName{prefix, i, count}.path(i));
    w.write(paths.back());
  }
  return paths;
}

}  // namespace qwenrt::gguf
