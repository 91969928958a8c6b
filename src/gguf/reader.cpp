#include "gguf/reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/checked.h"

namespace qwenrt::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32

// A bounds-checked little-endian cursor over the file; every read names what it reads.
class Cursor {
 public:
  Cursor(const std::string& path, std::span<const uint8_t> bytes) : path_(path), bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what, uint64_t max_bytes) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(what);
    if (len > max_bytes) {
      fail("{}: {} at offset {}: string length {} exceeds the limit of {} bytes", path_, what, at,
           len, max_bytes);
    }
    need(len, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      fail("{}: truncated: {} at offset {} needs {} bytes, only {} left (file is {} bytes)", path_,
           what, pos_, n, remaining(), bytes_.size());
    }
  }

  const std::string& path() const { return path_; }

 private:
  const std::string& path_;
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of this type: lets a count be checked against the bytes
// left before anything is allocated for it.
uint64_t min_encoded_size(ValueType type) {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::STRING:
      return 8;
    case ValueType::ARRAY:
      return 12;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
  }
  return 1;
}

class Parser {
 public:
  Parser(Cursor& cur, const Limits& limits) : cur_(cur), limits_(limits) {}

  ValueType read_type(std::string_view what) {
    const uint64_t at = cur_.pos();
    const auto id = cur_.read<uint32_t>(what);
    if (!is_valid_value_type(id)) {
      fail("{}: {} at offset {}: unknown value type {} (valid: 0..12)", cur_.path(), what, at, id);
    }
    return static_cast<ValueType>(id);
  }

  Value read_value(ValueType type, const std::string& key, int depth) {
    switch (type) {
      case ValueType::UINT8:
        return Value::u8(cur_.read<uint8_t>(key));
      case ValueType::INT8:
        return Value::i8(cur_.read<int8_t>(key));
      case ValueType::UINT16:
        return Value::u16(cur_.read<uint16_t>(key));
      case ValueType::INT16:
        return Value::i16(cur_.read<int16_t>(key));
      case ValueType::UINT32:
        return Value::u32(cur_.read<uint32_t>(key));
      case ValueType::INT32:
        return Value::i32(cur_.read<int32_t>(key));
      case ValueType::FLOAT32:
        return Value::f32(cur_.read<float>(key));
      case ValueType::UINT64:
        return Value::u64(cur_.read<uint64_t>(key));
      case ValueType::INT64:
        return Value::i64(cur_.read<int64_t>(key));
      case ValueType::FLOAT64:
        return Value::f64(cur_.read<double>(key));
      case ValueType::BOOL: {
        const uint64_t at = cur_.pos();
        const auto b = cur_.read<uint8_t>(key);
        if (b > 1)
          fail("{}: key '{}' at offset {}: bool byte is {}, expected 0 or 1", cur_.path(), key, at,
               b);
        return Value::boolean(b == 1);
      }
      case ValueType::STRING:
        return Value::str(cur_.read_string(fmt::format("key '{}'", key), limits_.max_string_bytes));
      case ValueType::ARRAY:
        return read_array(key, depth);
    }
    fail("{}: key '{}': unknown value type", cur_.path(), key);
  }

  Value read_array(const std::string& key, int depth) {
    if (depth >= limits_.max_array_depth) {
      fail("{}: key '{}': arrays nested deeper than {} levels", cur_.path(), key,
           limits_.max_array_depth);
    }
    const auto elem_type = read_type(fmt::format("key '{}' array element type", key));
    const uint64_t at = cur_.pos();
    const auto count = cur_.read<uint64_t>(fmt::format("key '{}' array length", key));
    if (count > limits_.max_array_items) {
      fail("{}: key '{}' at offset {}: array length {} exceeds the limit of {}", cur_.path(), key,
           at, count, limits_.max_array_items);
    }
    // count * min size cannot overflow: count <= max_array_items (< 2^32) and size <= 12.
    if (count * min_encoded_size(elem_type) > cur_.remaining()) {
      fail("{}: key '{}' at offset {}: array of {} {} values needs at least {} bytes, only {} left",
           cur_.path(), key, at, count, value_type_name(elem_type),
           count * min_encoded_size(elem_type), cur_.remaining());
    }
    std::vector<Value> items;
    items.reserve(count);
    for (uint64_t i = 0; i < count; ++i) items.push_back(read_value(elem_type, key, depth + 1));
    return Value::array(elem_type, std::move(items));
  }

 private:
  Cursor& cur_;
  const Limits& limits_;
};

}  // namespace

std::string one_line(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < n_dims; ++i) s += fmt::format("{}{}", i ? ", " : "", ne[i]);
  return s + "]";
}

Expected<File> File::open(const std::string& path, const Limits& limits) {
  return catch_error([&] {
    File f(MappedFile::open(path));
    try {
      f.parse(limits);
      if (limits.single_part) return f;
      if (const uint64_t count = f.split_count(limits); count > 1)
        f.open_other_parts(count, limits);
    } catch (const Error& e) {
      throw Error(one_line(e.what()));
    }
    return f;
  });
}

Expected<File> File::from_bytes(std::span<const uint8_t> bytes, std::string name,
                                const Limits& limits) {
  return catch_error([&] {
    File f(MappedFile::from_bytes(bytes, std::move(name)));
    try {
      f.parse(limits);
      if (limits.single_part) return f;
      if (const uint64_t count = f.split_count(limits); count > 1)
        fail("{}: the first part of a split GGUF ({} parts): its other parts are read from files",
             f.path(), count);
    } catch (const Error& e) {
      throw Error(one_line(e.what()));
    }
    return f;
  });
}

std::string SplitName::path(uint64_t i) const {
  return fmt::format("{}-{:05}-of-{:05}.gguf", stem, i + 1, count);
}

std::optional<SplitName> parse_split_name(std::string_view path) {
  constexpr std::string_view kGguf = ".gguf";
  constexpr size_t kTail = 15 + kGguf.size();  // "-NNNNN-of-MMMMM.gguf"
  if (path.size() <= kTail || !path.ends_with(kGguf)) return std::nullopt;
  const std::string_view tail = path.substr(path.size() - kTail, 15);
  auto number = [&](size_t at) -> std::optional<uint64_t> {
    uint64_t v = 0;
    for (size_t i = at; i < at + 5; ++i) {
      if (tail[i] < '0' || tail[i] > '9') return std::nullopt;
      v = v * 10 + static_cast<uint64_t>(tail[i] - '0');
    }
    return v;
  };
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return std::nullopt;
  const auto no = number(1), count = number(10);
  if (!no || !count || *no == 0 || *no > *count) return std::nullopt;
  return SplitName{std::string(path.substr(0, path.size() - kTail)), *no - 1, *count};
}

std::optional<std::string> split_part_path(std::string_view first, uint64_t index, uint64_t count) {
  const auto name = parse_split_name(first);
  if (!name || name->index != 0 || name->count != count || index >= count) return std::nullopt;
  return name->path(index);
}

uint64_t File::split_count(const Limits& limits) const {
  const auto count = get_uint("split.count");
  if (!count || *count == 1) return 1;
  if (*count == 0) fail("{}: split.count is 0", path());
  if (*count > limits.max_split_parts)
    fail("{}: split.count {} exceeds the limit of {} parts", path(), *count,
         limits.max_split_parts);
  const auto no = get_uint("split.no");
  if (!no) fail("{}: split.count is {} but split.no is missing", path(), *count);
  if (*no >= *count) fail("{}: split.no {} is not below split.count {}", path(), *no, *count);
  if (*no != 0) {
    // Say which file to open, when this one is named as the part it is.
    const auto name = parse_split_name(path());
    const std::string first =
        name && name->index == *no && name->count == *count ? name->path(0) : "its first part";
    fail("{}: part {} of a split GGUF of {} parts: open {}", path(), *no + 1, *count, first);
  }
  return *count;
}

void File::open_other_parts(uint64_t count, const Limits& limits) {
  const auto total = get_uint("split.tensors.count");
  for (uint64_t i = 1; i < count; ++i) {
    const auto part_path = split_part_path(path(), i, count);
    if (!part_path)
      fail(
          "{}: split.count is {}, but the name does not end in -00001-of-{:05}.gguf, so its other "
          "parts cannot be found",
          path(), count, count);
    File part(MappedFile::open(*part_path));
    part.parse(limits);
    const auto what = [&] { return fmt::format("{} (part {} of {})", *part_path, i + 1, count); };
    const auto no = part.get_uint("split.no");
    const auto n = part.get_uint("split.count");
    if (!no || !n) fail("{}: split.no / split.count missing: not a part of {}", what(), path());
    if (*n != count)
      fail("{}: split.count is {}, the first part's is {}: not a part of {}", what(), *n, count,
           path());
    if (*no != i) fail("{}: split.no is {}, expected {}", what(), *no, i);
    if (const auto t = part.get_uint("split.tensors.count"); t && total && *t != *total)
      fail("{}: split.tensors.count is {}, the first part's is {}", what(), *t, *total);
    if (tensors_.size() + part.tensors_.size() > limits.max_tensors)
      fail("{}: the parts so far hold more than the limit of {} tensors", what(),
           limits.max_tensors);
    for (auto& t : part.tensors_) {
      if (const TensorInfo* dup = find_tensor(t.name))
        fail("{}: tensor '{}' is also in part {}", what(), t.name, dup->part + 1);
      t.part = static_cast<int>(other_parts_.size() + 1);
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    // The mapping does not move with the MappedFile: the tensors' data pointers stay valid.
    other_parts_.push_back({std::move(part.file_), part.data_offset_});
  }
  if (total && *total != tensors_.size())
    fail("{}: split.tensors.count is {}, the {} parts hold {} tensors", path(), *total, count,
         tensors_.size());
}

uint64_t File::file_size() const {
  uint64_t size = file_.size();
  for (const auto& p : other_parts_) size += p.file.size();
  return size;
}

bool File::mapped() const {
  for (const OtherPart& p : other_parts_)
    if (!p.file.mapped()) return false;
  return file_.mapped();
}

std::vector<Part> File::parts() const {
  std::vector<Part> parts{{file_.path(), file_.data(), file_.size(), data_offset_}};
  for (const auto& p : other_parts_)
    parts.push_back({p.file.path(), p.file.data(), p.file.size(), p.data_offset});
  return parts;
}

void File::parse(const Limits& limits) {
  const std::string& path = file_.path();
  Cursor cur(path, file_.bytes());
  Parser parser(cur, limits);

  if (file_.size() < 4)
    fail("{}: not a GGUF file: {} bytes, too short for the magic", path, file_.size());
  const auto magic = cur.read<uint32_t>("magic");
  if (magic != kMagic) {
    fail(
        "{}: not a GGUF file: magic is {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 "
        "(\"GGUF\")",
        path, magic & 0xff, (magic >> 8) & 0xff, (magic >> 16) & 0xff, magic >> 24);
  }
  version_ = cur.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1) fail("{}: GGUF version 1 is not supported (expected 2 or 3)", path);
    // A big-endian file stores 2 or 3 in the high bytes; version 0 is just an unknown version.
    if (version_ != 0 && (version_ & 0xffff) == 0)
      fail("{}: big-endian GGUF (version bytes {:#010x}) is not supported", path, version_);
    fail("{}: unsupported GGUF version {} (expected 2 or 3)", path, version_);
  }
  const uint64_t tensor_count = cur.read<uint64_t>("tensor count");
  const uint64_t kv_count = cur.read<uint64_t>("metadata key count");
  if (kv_count > limits.max_keys) {
    fail("{}: metadata key count {} exceeds the limit of {}", path, kv_count, limits.max_keys);
  }
  if (tensor_count > limits.max_tensors) {
    fail("{}: tensor count {} exceeds the limit of {}", path, tensor_count, limits.max_tensors);
  }
  // Each key needs >= 13 bytes (length, type, one byte of value); each tensor >= 28.
  if (kv_count > cur.remaining() / 13) {
    fail("{}: metadata key count {} cannot fit in the {} bytes left", path, kv_count,
         cur.remaining());
  }
  if (tensor_count > cur.remaining() / 28) {
    fail("{}: tensor count {} cannot fit in the {} bytes left", path, tensor_count,
         cur.remaining());
  }

  metadata_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t at = cur.pos();
    std::string key = cur.read_string(fmt::format("metadata key #{}", i), limits.max_string_bytes);
    if (key.empty()) fail("{}: metadata key #{} at offset {} is empty", path, i, at);
    const auto type = parser.read_type(fmt::format("key '{}' value type", key));
    Value value = parser.read_value(type, key, 0);
    if (!key_index_.emplace(key, metadata_.size()).second) {
      fail("{}: duplicate metadata key '{}' (second at offset {})", path, key, at);
    }
    metadata_.push_back({std::move(key), std::move(value)});
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::UINT32) {
      fail("{}: general.alignment: expected type uint32, got {}", path, value_type_name(a->type));
    }
    const uint64_t align = std::get<uint64_t>(a->data);
    if (align == 0 || (align & (align - 1)) != 0) {
      fail("{}: general.alignment: expected a power of two, got {}", path, align);
    }
    if (align > limits.max_alignment) {
      fail("{}: general.alignment: {} exceeds the limit of {}", path, align, limits.max_alignment);
    }
    alignment_ = align;
  }

  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    const uint64_t at = cur.pos();
    t.name = cur.read_string(fmt::format("tensor #{} name", i), limits.max_tensor_name_bytes);
    if (t.name.empty()) fail("{}: tensor #{} at offset {} has an empty name", path, i, at);
    const std::string what = fmt::format("tensor '{}'", t.name);
    const auto n_dims = cur.read<uint32_t>(what + " dimension count");
    if (n_dims < 1 || n_dims > kMaxDims) {
      fail("{}: {}: {} dimensions, expected 1..{}", path, what, n_dims, kMaxDims);
    }
    t.n_dims = static_cast<int>(n_dims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = cur.read<uint64_t>(what + " shape");
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("{}: {}: dimension {} is {}, expected 1..2^63-1", path, what, d, dim);
      }
      auto product = checked_mul(n_elements, dim);
      if (!product || *product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("{}: {}: element count of shape overflows 63 bits", path, what);
      }
      n_elements = *product;
      t.ne[d] = static_cast<int64_t>(dim);
    }
    const auto type_id = cur.read<uint32_t>(what + " type");
    const auto type_traits = dtype_traits(type_id);
    if (!type_traits) fail("{}: {}: unknown tensor type id {}", path, what, type_id);
    t.dtype = static_cast<DType>(type_id);
    if (t.ne[0] % type_traits->block_elems != 0) {
      fail("{}: {}: type {} needs the first dimension to be a multiple of {}, got {}", path, what,
           type_traits->name, type_traits->block_elems, t.ne[0]);
    }
    // n_elements / block_elems * block_bytes <= 2^63 * 292 could overflow: check it.
    auto n_bytes = checked_mul(n_elements / type_traits->block_elems, type_traits->block_bytes);
    if (!n_bytes) fail("{}: {}: byte size overflows 64 bits", path, what);
    t.n_bytes = *n_bytes;
    t.offset = cur.read<uint64_t>(what + " data offset");
    if (t.offset % alignment_ != 0) {
      fail("{}: {}: data offset {} is not a multiple of the alignment {}", path, what, t.offset,
           alignment_);
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      fail("{}: duplicate tensor name '{}' (second at offset {})", path, t.name, at);
    }
    tensors_.push_back(std::move(t));
  }

  auto data_start = checked_align_up(cur.pos(), alignment_);
  if (!data_start) fail("{}: data section offset overflows", path);
  data_offset_ = *data_start;
  if (tensors_.empty()) return;
  if (data_offset_ > file_.size()) {
    fail("{}: truncated: data section starts at offset {}, file is {} bytes", path, data_offset_,
         file_.size());
  }
  const uint64_t data_size = file_.size() - data_offset_;

  for (auto& t : tensors_) {
    auto end = checked_add(t.offset, t.n_bytes);
    if (!end || *end > data_size) {
      fail(
          "{}: tensor '{}': data [{}, {}) lies outside the data section of {} bytes (offsets "
          "relative to {})",
          path, t.name, t.offset, end ? *end : std::numeric_limits<uint64_t>::max(), data_size,
          data_offset_);
    }
    t.data = file_.data() + data_offset_ + t.offset;
  }

  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = tensors_[order[i - 1]];
    const auto& next = tensors_[order[i]];
    if (prev.offset + prev.n_bytes > next.offset) {
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path, prev.name, prev.offset,
           prev.offset + prev.n_bytes, next.name, next.offset, next.offset + next.n_bytes);
    }
  }
}

const Value* File::find(std::string_view key) const {
  auto it = key_index_.find(std::string(key));
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, std::string_view key,
                             std::string_view expected, ValueType actual) {
  fail("{}: key '{}': expected {}, got {}", path, key, expected, value_type_name(actual));
}

}  // namespace

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(path(), key, "a string", v->type);
  return v->as_string();
}

std::optional<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&v->data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v->data)) {
    if (*i < 0) fail("{}: key '{}': expected a non-negative integer, got {}", path(), key, *i);
    return static_cast<uint64_t>(*i);
  }
  wrong_type(path(), key, "an integer", v->type);
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&v->data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v->data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail("{}: key '{}': value {} does not fit in int64", path(), key, *u);
    }
    return static_cast<int64_t>(*u);
  }
  wrong_type(path(), key, "an integer", v->type);
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (const auto* d = std::get_if<double>(&v->data)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v->data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v->data)) return static_cast<double>(*i);
  wrong_type(path(), key, "a number", v->type);
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL) wrong_type(path(), key, "a bool", v->type);
  return std::get<bool>(v->data);
}

const Array* File::get_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  if (v->type != ValueType::ARRAY) wrong_type(path(), key, "an array", v->type);
  return &v->as_array();
}

}  // namespace qwenrt::gguf
