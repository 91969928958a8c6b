#include "gguf/json.h"

namespace qwenrt::gguf {

nlohmann::json to_json(const Value& value) {
  return std::visit(
      [&](const auto& v) -> nlohmann::json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Array>) {
          auto list = nlohmann::json::array();
          for (const auto& item : v.items) list.push_back(to_json(item));
          return list;
        } else {
          return v;
        }
      },
      value.data);
}

nlohmann::json to_json(const File& file) {
  nlohmann::json out;
  out["version"] = file.version();
  out["alignment"] = file.alignment();
  out["data_offset"] = file.data_offset();
  const std::vector<Part> parts = file.parts();
  if (parts.size() > 1) {
    auto& list = out["parts"] = nlohmann::json::array();
    for (const auto& p : parts)
      list.push_back({{"path", p.path}, {"size", p.size}, {"data_offset", p.data_offset}});
  }
  auto& metadata = out["metadata"] = nlohmann::json::array();
  for (const auto& kv : file.metadata()) {
    nlohmann::json entry = {{"key", kv.key}, {"type", value_type_name(kv.value.type)}};
    if (kv.value.type == ValueType::ARRAY) {
      entry["elem_type"] = value_type_name(kv.value.as_array().elem_type);
    }
    entry["value"] = to_json(kv.value);
    metadata.push_back(std::move(entry));
  }
  auto& tensors = out["tensors"] = nlohmann::json::array();
  for (const auto& t : file.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"type", dtype_name(t.dtype)},
                       {"shape", std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)},
                       {"offset", t.offset},
                       {"n_bytes", t.n_bytes}});
    if (parts.size() > 1) tensors.back()["part"] = t.part;
  }
  return out;
}

}  // namespace qwenrt::gguf
