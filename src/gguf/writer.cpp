#include "gguf/writer.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "core/checked.h"
#include "core/error.h"
#include "core/tensor.h"

namespace qwenrt::gguf {
namespace {

constexpr uint32_t kVersion = 3;

// Appends little-endian encodings to a byte vector.
struct ByteSink {
  std::vector<uint8_t> bytes;
  void put(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = bytes.size();
    bytes.resize(at + n);
    std::memcpy(bytes.data() + at, p, n);
  }
  uint64_t written() const { return bytes.size(); }
};

// Writes straight to a FILE*, counting bytes.
struct FileSink {
  std::FILE* file;
  const std::string& path;
  uint64_t count = 0;
  void put(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, file) != n)
      fail("{}: write failed after {} bytes", path, count);
    count += n;
  }
  uint64_t written() const { return count; }
};

template <class Sink, class T>
void put_scalar(Sink& sink, T v) {
  sink.put(&v, sizeof(v));
}

template <class Sink>
void put_string(Sink& sink, const std::string& s) {
  put_scalar<Sink, uint64_t>(sink, s.size());
  sink.put(s.data(), s.size());
}

template <class Sink>
void put_value(Sink& sink, const Value& v) {
  switch (v.type) {
    case ValueType::UINT8:
      return put_scalar(sink, static_cast<uint8_t>(std::get<uint64_t>(v.data)));
    case ValueType::INT8:
      return put_scalar(sink, static_cast<int8_t>(std::get<int64_t>(v.data)));
    case ValueType::UINT16:
      return put_scalar(sink, static_cast<uint16_t>(std::get<uint64_t>(v.data)));
    case ValueType::INT16:
      return put_scalar(sink, static_cast<int16_t>(std::get<int64_t>(v.data)));
    case ValueType::UINT32:
      return put_scalar(sink, static_cast<uint32_t>(std::get<uint64_t>(v.data)));
    case ValueType::INT32:
      return put_scalar(sink, static_cast<int32_t>(std::get<int64_t>(v.data)));
    case ValueType::FLOAT32:
      return put_scalar(sink, static_cast<float>(std::get<double>(v.data)));
    case ValueType::BOOL:
      return put_scalar(sink, static_cast<uint8_t>(std::get<bool>(v.data)));
    case ValueType::STRING:
      return put_string(sink, std::get<std::string>(v.data));
    case ValueType::UINT64:
      return put_scalar(sink, std::get<uint64_t>(v.data));
    case ValueType::INT64:
      return put_scalar(sink, std::get<int64_t>(v.data));
    case ValueType::FLOAT64:
      return put_scalar(sink, std::get<double>(v.data));
    case ValueType::ARRAY: {
      const auto& a = v.as_array();
      put_scalar(sink, static_cast<uint32_t>(a.elem_type));
      put_scalar<Sink, uint64_t>(sink, a.items.size());
      for (const auto& item : a.items) {
        if (item.type != a.elem_type) {
          fail("gguf writer: array item of type {} in an array of {}", value_type_name(item.type),
               value_type_name(a.elem_type));
        }
        put_value(sink, item);
      }
      return;
    }
  }
}

template <class Sink>
void pad_to(Sink& sink, uint64_t alignment) {
  static const uint8_t zeros[256] = {};
  uint64_t pad = (alignment - sink.written() % alignment) % alignment;
  while (pad > 0) {
    const uint64_t n = std::min<uint64_t>(pad, sizeof(zeros));
    sink.put(zeros, n);
    pad -= n;
  }
}

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    fail("gguf writer: alignment must be a power of two, got {}", alignment);
  }
  if (alignment != 32) set("general.alignment", Value::u32(alignment));
}

void Writer::set(const std::string& key, Value value) {
  for (auto& kv : metadata_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  metadata_.push_back({key, std::move(value)});
}

void Writer::add(PendingTensor t) {
  if (t.ne.empty() || t.ne.size() > kMaxDims) {
    fail("gguf writer: tensor '{}': {} dimensions, expected 1..{}", t.name, t.ne.size(), kMaxDims);
  }
  for (const auto& other : tensors_) {
    if (other.name == t.name) fail("gguf writer: duplicate tensor name '{}'", t.name);
  }
  const auto& tr = traits(t.dtype);
  uint64_t n = 1;
  for (int64_t d : t.ne) {
    if (d <= 0) fail("gguf writer: tensor '{}': dimension {} must be positive", t.name, d);
    auto p = checked_mul(n, static_cast<uint64_t>(d));
    if (!p) fail("gguf writer: tensor '{}': element count overflows", t.name);
    n = *p;
  }
  if (t.ne[0] % tr.block_elems != 0) {
    fail(
        "gguf writer: tensor '{}': type {} needs the first dimension to be a multiple of {}, got "
        "{}",
        t.name, tr.name, tr.block_elems, t.ne[0]);
  }
  t.n_bytes = n / tr.block_elems * tr.block_bytes;
  if (!t.fill && t.data.size() != t.n_bytes) {
    fail("gguf writer: tensor '{}': {} bytes given, shape and type {} need {}", t.name,
         t.data.size(), tr.name, t.n_bytes);
  }
  t.offset = *checked_align_up(data_size_, alignment_);
  data_size_ = t.offset + t.n_bytes;
  tensors_.push_back(std::move(t));
}

void Writer::add_tensor(const std::string& name, DType dtype, std::vector<int64_t> ne,
                        std::vector<uint8_t> data) {
  add({name, dtype, std::move(ne), 0, 0, std::move(data), nullptr});
}

void Writer::add_tensor(const std::string& name, DType dtype, std::vector<int64_t> ne, Fill fill) {
  if (!fill) fail("gguf writer: tensor '{}': empty fill callback", name);
  add({name, dtype, std::move(ne), 0, 0, {}, std::move(fill)});
}

template <class Sink>
void Writer::emit(Sink& sink) const {
  put_scalar<Sink, uint32_t>(sink, 0x46554747);
  put_scalar<Sink, uint32_t>(sink, kVersion);
  put_scalar<Sink, uint64_t>(sink, tensors_.size());
  put_scalar<Sink, uint64_t>(sink, metadata_.size());
  for (const auto& kv : metadata_) {
    put_string(sink, kv.key);
    put_scalar(sink, static_cast<uint32_t>(kv.value.type));
    put_value(sink, kv.value);
  }
  for (const auto& t : tensors_) {
    put_string(sink, t.name);
    put_scalar<Sink, uint32_t>(sink, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put_scalar<Sink, uint64_t>(sink, static_cast<uint64_t>(d));
    put_scalar(sink, static_cast<uint32_t>(t.dtype));
    put_scalar<Sink, uint64_t>(sink, t.offset);
  }
  pad_to(sink, alignment_);
  const uint64_t data_start = sink.written();
  std::vector<uint8_t> scratch;
  for (const auto& t : tensors_) {
    // Pad up to this tensor's offset within the data section.
    while (sink.written() - data_start < t.offset) {
      const uint8_t zero = 0;
      sink.put(&zero, 1);
    }
    if (t.fill) {
      scratch.assign(t.n_bytes, 0);
      t.fill(std::span<uint8_t>(scratch));
      sink.put(scratch.data(), scratch.size());
    } else {
      sink.put(t.data.data(), t.data.size());
    }
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  ByteSink sink;
  emit(sink);
  return std::move(sink.bytes);
}

void Writer::write(const std::string& path) const {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"),
                                                       &std::fclose);
  if (!file) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  FileSink sink{file.get(), path};
  emit(sink);
  if (std::fflush(file.get()) != 0) fail("{}: write failed: {}", path, std::strerror(errno));
}

}  // namespace qwenrt::gguf
