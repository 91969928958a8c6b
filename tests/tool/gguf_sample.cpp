// Writes a GGUF with qwenrt's writer holding every metadata value type and several tensor types,
// for the interop check against the PyPI gguf reader (tests/python/gguf_interop.py).
//
//   gguf_sample OUT.gguf [ALIGNMENT]
#include <cstdio>
#include <cstdlib>
#include <random>

#include "core/error.h"
#include "gguf/writer.h"

using qwenrt::DType;
using qwenrt::gguf::Value;
using qwenrt::gguf::ValueType;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gguf_sample OUT.gguf [ALIGNMENT]\n");
    return 2;
  }
  try {
    const uint32_t alignment = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 32;
    qwenrt::gguf::Writer w(alignment);
    w.set("general.architecture", Value::str("qwen35"));
    w.set("general.name", Value::str("Qwen3.6-27B sample"));
    w.set("sample.u8", Value::u8(200));
    w.set("sample.i8", Value::i8(-100));
    w.set("sample.u16", Value::u16(60000));
    w.set("sample.i16", Value::i16(-30000));
    w.set("sample.u32", Value::u32(4000000000u));
    w.set("sample.i32", Value::i32(-2000000000));
    w.set("sample.f32", Value::f32(0.1f));
    w.set("sample.bool", Value::boolean(true));
    w.set("sample.string", Value::str("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c\n<|im_end|>"));
    w.set("sample.u64", Value::u64(18000000000000000000ull));
    w.set("sample.i64", Value::i64(-9000000000000000000ll));
    w.set("sample.f64", Value::f64(2.718281828459045));
    w.set("sample.empty_string", Value::str(""));
    w.set("sample.strings", Value::strings({"a", "", "<think>", "\xc4\xa0the"}));
    w.set("sample.i32s",
          Value::array(ValueType::INT32, {Value::i32(1), Value::i32(-2), Value::i32(3)}));
    w.set("sample.f32s", Value::array(ValueType::FLOAT32, {Value::f32(1.5f), Value::f32(-0.25f)}));
    w.set("sample.bools",
          Value::array(ValueType::BOOL, {Value::boolean(false), Value::boolean(true)}));
    w.set("sample.empty", Value::array(ValueType::UINT8, {}));
    w.set("sample.nested",
          Value::array(ValueType::ARRAY,
                       {Value::array(ValueType::INT32, {Value::i32(7), Value::i32(8)}),
                        Value::array(ValueType::INT32, {Value::i32(9)})}));

    std::mt19937 rng(1234);
    auto random_bytes = [&](size_t n) {
      std::vector<uint8_t> b(n);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      return b;
    };
    w.add_tensor("t.f32", DType::F32, {5, 3}, random_bytes(5 * 3 * 4));
    w.add_tensor("t.f16", DType::F16, {7}, random_bytes(7 * 2));
    w.add_tensor("t.q8_0", DType::Q8_0, {64, 2, 3}, random_bytes(2 * 2 * 3 * 34));
    w.add_tensor("t.q4_k", DType::Q4_K, {256, 1, 2, 2}, random_bytes(4 * 144));
    w.add_tensor("t.bf16.fill", DType::BF16, {33, 2}, [](std::span<uint8_t> dst) {
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>(i * 7);
    });
    w.write(argv[1]);
  } catch (const qwenrt::Error& e) {
    std::fprintf(stderr, "gguf_sample: %s\n", e.what());
    return 1;
  }
  return 0;
}
