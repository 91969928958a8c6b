#include <gtest/gtest.h>

#include "gguf/reader.h"
#include "gguf/writer.h"

namespace qwenrt::gguf {
namespace {

File round_trip(const Writer& w) {
  auto bytes = w.to_bytes();
  auto file = File::from_bytes(bytes, "roundtrip.gguf");
  EXPECT_TRUE(file.ok()) << file.error();
  return std::move(file).value();
}

TEST(Gguf, WriterReaderRoundTripEveryValueType) {
  Writer w;
  w.set("general.architecture", Value::str("qwen35"));
  w.set("u8", Value::u8(250));
  w.set("i8", Value::i8(-5));
  w.set("u16", Value::u16(65000));
  w.set("i16", Value::i16(-32000));
  w.set("u32", Value::u32(7));
  w.set("i32", Value::i32(-7));
  w.set("f32", Value::f32(0.25f));
  w.set("bool", Value::boolean(true));
  w.set("u64", Value::u64(1ull << 60));
  w.set("i64", Value::i64(-(1ll << 60)));
  w.set("f64", Value::f64(1e-300));
  w.set("strings", Value::strings({"x", "", "yz"}));
  w.set("nested", Value::array(ValueType::ARRAY, {Value::array(ValueType::UINT8, {Value::u8(1)})}));
  w.set("u32", Value::u32(8));  // replaces, keeps position
  std::vector<uint8_t> data(2 * 34, 0xab);
  w.add_tensor("q", DType::Q8_0, {32, 2}, data);
  w.add_tensor("f", DType::F32, {3}, [](std::span<uint8_t> dst) {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>(i);
  });

  File f = round_trip(w);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 14u);
  EXPECT_EQ(f.metadata()[5].key, "u32");
  EXPECT_EQ(f.get_uint("u32"), std::optional<uint64_t>(8));
  EXPECT_EQ(f.get_uint("u8"), std::optional<uint64_t>(250));
  EXPECT_EQ(f.get_int("i16"), std::optional<int64_t>(-32000));
  EXPECT_EQ(f.get_int("i64"), std::optional<int64_t>(-(1ll << 60)));
  EXPECT_EQ(f.get_float("f32"), std::optional<double>(0.25));
  EXPECT_EQ(f.get_float("f64"), std::optional<double>(1e-300));
  EXPECT_EQ(f.get_bool("bool"), std::optional<bool>(true));
  EXPECT_EQ(f.get_string("general.architecture"), std::optional<std::string>("qwen35"));
  const Array* strings = f.get_array("strings");
  ASSERT_NE(strings, nullptr);
  ASSERT_EQ(strings->items.size(), 3u);
  EXPECT_EQ(strings->items[2].as_string(), "yz");
  const Array* nested = f.get_array("nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->items[0].as_array().items[0].type, ValueType::UINT8);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_FALSE(f.get_uint("missing"));

  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo* q = f.find_tensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::Q8_0);
  EXPECT_EQ(q->n_bytes, 68u);
  EXPECT_EQ(q->data[67], 0xab);
  EXPECT_EQ(q->shape_string(), "[32, 2]");
  const TensorInfo* t = f.find_tensor("f");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->offset % 32, 0u);
  EXPECT_EQ(t->data[11], 11);
  EXPECT_EQ(f.data_offset() % 32, 0u);
}

TEST(Gguf, TypedGettersNameKeyAndTypes) {
  Writer w;
  w.set("s", Value::str("x"));
  w.set("neg", Value::i32(-1));
  File f = round_trip(w);
  try {
    f.get_uint("s");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 's': expected an integer, got string"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(f.get_uint("neg"), Error);
  EXPECT_THROW(f.get_string("neg"), Error);
  EXPECT_THROW(f.get_array("s"), Error);
}

TEST(Gguf, CustomAlignmentIsHonoured) {
  Writer w(256);
  w.add_tensor("a", DType::F32, {1}, std::vector<uint8_t>(4, 1));
  w.add_tensor("b", DType::F32, {1}, std::vector<uint8_t>(4, 2));
  File f = round_trip(w);
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.find_tensor("b")->offset, 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
}

TEST(Gguf, WriterRejectsBadTensors) {
  Writer w;
  EXPECT_THROW(w.add_tensor("a", DType::Q4_K, {100}, std::vector<uint8_t>(144)), Error);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {2}, std::vector<uint8_t>(7)), Error);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), Error);
  w.add_tensor("a", DType::F32, {1}, std::vector<uint8_t>(4));
  EXPECT_THROW(w.add_tensor("a", DType::F32, {1}, std::vector<uint8_t>(4)), Error);
  EXPECT_THROW(Writer(48), Error);
}

TEST(Gguf, EmptyFileOpensWithNoTensors) {
  Writer w;
  File f = round_trip(w);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

}  // namespace
}  // namespace qwenrt::gguf
