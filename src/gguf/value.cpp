#include "gguf/value.h"

#include <fmt/format.h>

namespace qwenrt::gguf {

std::string_view value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UINT8:
      return "uint8";
    case ValueType::INT8:
      return "int8";
    case ValueType::UINT16:
      return "uint16";
    case ValueType::INT16:
      return "int16";
    case ValueType::UINT32:
      return "uint32";
    case ValueType::INT32:
      return "int32";
    case ValueType::FLOAT32:
      return "float32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::UINT64:
      return "uint64";
    case ValueType::INT64:
      return "int64";
    case ValueType::FLOAT64:
      return "float64";
  }
  return "invalid";
}

bool is_valid_value_type(uint32_t id) {
  return id <= static_cast<uint32_t>(ValueType::FLOAT64);
}

Value Value::strings(const std::vector<std::string>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (const auto& s : items) values.push_back(str(s));
  return array(ValueType::STRING, std::move(values));
}

bool Value::is_integer() const {
  return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

namespace {

std::string quote(const std::string& s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string Value::to_display(size_t max_items) const {
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return quote(v, 120);
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          if (type == ValueType::FLOAT32) return fmt::format("{}", static_cast<float>(v));
          return fmt::format("{}", v);
        } else if constexpr (std::is_same_v<T, Array>) {
          std::string out =
              fmt::format("[{} x {}] [", v.items.size(), value_type_name(v.elem_type));
          for (size_t i = 0; i < v.items.size() && i < max_items; ++i) {
            out += (i ? ", " : "") + v.items[i].to_display(max_items);
          }
          return out + (v.items.size() > max_items ? ", ...]" : "]");
        } else {
          return fmt::format("{}", v);
        }
      },
      data);
}

}  // namespace qwenrt::gguf
