// GGUF metadata values: the 13 on-disk value types, arrays (of any type, nested) included.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace qwenrt::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

std::string_view value_type_name(ValueType type);
bool is_valid_value_type(uint32_t id);

struct Value;
struct Array {
  ValueType elem_type = ValueType::UINT8;
  std::vector<Value> items;
};

// One metadata value. Integers of every width widen to uint64_t / int64_t, floats to double;
// `type` keeps the on-disk type so a writer can round-trip it exactly.
struct Value {
  ValueType type = ValueType::UINT8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  static Value u8(uint8_t v) { return {ValueType::UINT8, uint64_t{v}}; }
  static Value i8(int8_t v) { return {ValueType::INT8, int64_t{v}}; }
  static Value u16(uint16_t v) { return {ValueType::UINT16, uint64_t{v}}; }
  static Value i16(int16_t v) { return {ValueType::INT16, int64_t{v}}; }
  static Value u32(uint32_t v) { return {ValueType::UINT32, uint64_t{v}}; }
  static Value i32(int32_t v) { return {ValueType::INT32, int64_t{v}}; }
  static Value f32(float v) { return {ValueType::FLOAT32, double{v}}; }
  static Value boolean(bool v) { return {ValueType::BOOL, v}; }
  static Value str(std::string v) { return {ValueType::STRING, std::move(v)}; }
  static Value u64(uint64_t v) { return {ValueType::UINT64, v}; }
  static Value i64(int64_t v) { return {ValueType::INT64, v}; }
  static Value f64(double v) { return {ValueType::FLOAT64, v}; }
  static Value array(ValueType elem_type, std::vector<Value> items) {
    return {ValueType::ARRAY, Array{elem_type, std::move(items)}};
  }
  static Value strings(const std::vector<std::string>& items);

  bool is_integer() const;
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  const std::string& as_string() const { return std::get<std::string>(data); }
  const Array& as_array() const { return std::get<Array>(data); }

  // Short human form: numbers, quoted strings, arrays summarised past `max_items`.
  std::string to_display(size_t max_items = 8) const;
};

struct KeyValue {
  std::string key;
  Value value;
};

}  // namespace qwenrt::gguf
