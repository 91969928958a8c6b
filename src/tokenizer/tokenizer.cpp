#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"
#include "tokenizer/utf8.h"

namespace qwenrt::tokenizer {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

std::string quoted(std::string_view text) {
  // Error messages stay one printable line whatever the metadata holds.
  std::string out = "'";
  for (const char c : text) {
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x20 || b == 0x7F || c == '\'' || c == '\\') {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string required_string(const gguf::File& file, std::string_view key) {
  std::optional<std::string> value = file.get_string(key);  // throws on a wrong type
  if (!value) fail("{}: tokenizer key '{}' is missing", file.path(), key);
  return *value;
}

const gguf::Array& required_array(const gguf::File& file, std::string_view key,
                                  gguf::ValueType elem_type) {
  const gguf::Value* value = file.find(key);
  if (value == nullptr) fail("{}: tokenizer key '{}' is missing", file.path(), key);
  if (value->type != gguf::ValueType::ARRAY) {
    fail("{}: tokenizer key '{}': expected an array of {}, got {}", file.path(), key,
         gguf::value_type_name(elem_type), gguf::value_type_name(value->type));
  }
  const gguf::Array& array = value->as_array();
  if (array.elem_type != elem_type) {
    fail("{}: tokenizer key '{}': expected an array of {}, got an array of {}", file.path(), key,
         gguf::value_type_name(elem_type), gguf::value_type_name(array.elem_type));
  }
  return array;
}

// Appends the raw bytes that byte-level text (as vocabularies store normal tokens) spells; false
// if a character is not in the byte-level alphabet.
bool append_unmapped(std::string_view text, std::string& out) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8_sequence_length(text, pos);
    if (length == 0) return false;
    const int byte = byte_level::codepoint_to_byte(decode_utf8(text, pos, length));
    if (byte < 0) return false;
    out += static_cast<char>(byte);
    pos += length;
  }
  return true;
}

// Token text -> id for the normal tokens, used while resolving merges: ~1M lookups on a real
// vocabulary, so a flat table (hash and id per slot, text compared only on a hash match) instead
// of a node-based map, whose cache misses made loading take a second.
class TextIndex {
 public:
  TextIndex(const std::vector<gguf::Value>& tokens, size_t n_expected) : tokens_(tokens) {
    size_t capacity = 64;
    while (capacity < 2 * n_expected) capacity *= 2;
    slots_.assign(capacity, Slot{0, -1});
  }

  // Returns the id already holding `text`, or -1 after adding `id`.
  int32_t insert(std::string_view text, int32_t id) {
    const uint64_t h = hash(text);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].id < 0) {
        slots_[i] = {h, id};
        return -1;
      }
      if (slots_[i].hash == h && text_of(slots_[i].id) == text) return slots_[i].id;
    }
  }

  int32_t find(std::string_view text) const {
    const uint64_t h = hash(text);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].id < 0) return -1;
      if (slots_[i].hash == h && text_of(slots_[i].id) == text) return slots_[i].id;
    }
  }

 private:
  struct Slot {
    uint64_t hash;
    int32_t id;  // -1: free
  };
  static uint64_t hash(std::string_view text) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a final mix for the low bits
    for (const char c : text) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    return (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull;
  }
  std::string_view text_of(int32_t id) const {
    return tokens_[static_cast<size_t>(id)].as_string();
  }

  const std::vector<gguf::Value>& tokens_;
  std::vector<Slot> slots_;
};

}  // namespace

Tokenizer Tokenizer::from_gguf(const gguf::File& file, const Options& options) {
  const std::string& path = file.path();
  const std::string model = required_string(file, kModelKey);
  if (model != "gpt2") {
    fail("{}: {}: expected 'gpt2' (byte-level BPE), got {}", path, kModelKey, quoted(model));
  }
  const std::string pre = required_string(file, kPreKey);
  if (pre != "qwen35") {
    fail("{}: {}: expected 'qwen35', got {} (no other pre-tokenizer is implemented)", path, kPreKey,
         quoted(pre));
  }
  const gguf::Array& tokens = required_array(file, kTokensKey, gguf::ValueType::STRING);
  const gguf::Array& types = required_array(file, kTypesKey, gguf::ValueType::INT32);
  const gguf::Array& merges = required_array(file, kMergesKey, gguf::ValueType::STRING);
  if (tokens.items.empty()) fail("{}: {} is empty", path, kTokensKey);
  if (types.items.size() != tokens.items.size()) {
    fail("{}: {} has {} entries, expected {} (one per entry of {})", path, kTypesKey,
         types.items.size(), tokens.items.size(), kTokensKey);
  }
  if (tokens.items.size() > static_cast<size_t>(INT32_MAX)) {
    fail("{}: {} has {} entries, more than token ids can address", path, kTokensKey,
         tokens.items.size());
  }

  Tokenizer tok;
  tok.options_ = options;
  const size_t n = tokens.items.size();
  tok.types_.resize(n);
  tok.offsets_.reserve(n + 1);
  tok.offsets_.push_back(0);
  // Byte-level text of the normal tokens -> id, for resolving merges (load time only).
  TextIndex normal(tokens.items, n);
  std::array<int32_t, 256> byte_token;
  byte_token.fill(-1);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& text = tokens.items[i].as_string();
    const int64_t type = std::get<int64_t>(types.items[i].data);
    switch (type) {
      case 1: {
        if (text.empty() || !append_unmapped(text, tok.bytes_)) {
          fail("{}: token {} {} is marked normal but is not byte-level BPE text", path, id,
               quoted(text));
        }
        if (const int32_t earlier = normal.insert(text, id); earlier >= 0) {
          fail("{}: tokens {} and {} are both {}", path, earlier, id, quoted(text));
        }
        if (tok.bytes_.size() - tok.offsets_.back() == 1) {
          byte_token[static_cast<uint8_t>(tok.bytes_.back())] = id;
        }
        break;
      }
      case 3:
      case 4:
        if (text.empty()) fail("{}: added token {} has empty text", path, id);
        if (!is_valid_utf8(text)) {
          fail("{}: added token {} {} is not UTF-8", path, id, quoted(text));
        }
        if (auto [it, inserted] = tok.added_.emplace(text, id); !inserted) {
          fail("{}: added tokens {} and {} are both {}", path, it->second, id, quoted(text));
        }
        tok.bytes_ += text;
        break;
      case 2:
      case 5:
        break;
      default:
        fail(
            "{}: {}[{}] (token {}) is {}, expected 1 (normal), 2 (unknown), 3 (control), "
            "4 (user-defined) or 5 (unused)",
            path, kTypesKey, i, quoted(text), type);
    }
    tok.types_[i] = static_cast<TokenType>(type);
    if (tok.bytes_.size() > UINT32_MAX) fail("{}: {} holds over 4 GiB of text", path, kTokensKey);
    tok.offsets_.push_back(static_cast<uint32_t>(tok.bytes_.size()));
  }
  for (int b = 0; b < 256; ++b) {
    if (byte_token[b] < 0) {
      std::string utf8;
      append_utf8(byte_level::kByteToCodepoint[b], utf8);
      fail("{}: {} has no normal token for byte 0x{:02x} ({}); byte-level BPE needs all 256", path,
           kTokensKey, b, quoted(utf8));
    }
    tok.bpe_.set_byte_token(static_cast<uint8_t>(b), byte_token[b]);
  }

  tok.bpe_.reserve(merges.items.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.items.size(); ++rank) {
    const std::string& merge = merges.items[rank].as_string();
    const size_t space = merge.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      fail("{}: {}[{}] is {}, expected two tokens separated by one space", path, kMergesKey, rank,
           quoted(merge));
    }
    const std::string_view left(merge.data(), space);
    const std::string_view right(merge.data() + space + 1, merge.size() - space - 1);
    joined.assign(left).append(right);
    const int32_t l = normal.find(left), r = normal.find(right), m = normal.find(joined);
    if (l < 0 || r < 0 || m < 0) {
      const std::string_view missing = l < 0 ? left : r < 0 ? right : std::string_view(joined);
      fail("{}: {}[{}] {}: {} is not a normal token of the vocabulary", path, kMergesKey, rank,
           quoted(merge), quoted(missing));
    }
    if (!tok.bpe_.add_merge(l, r, m, static_cast<int32_t>(rank))) {
      fail("{}: {}[{}] {} repeats an earlier merge", path, kMergesKey, rank, quoted(merge));
    }
  }

  tok.added_by_first_byte_.resize(256);
  for (const auto& [text, id] : tok.added_) {
    tok.added_by_first_byte_[static_cast<uint8_t>(text[0])].push_back(id);
  }
  for (auto& ids : tok.added_by_first_byte_) {
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      const size_t la = tok.offsets_[a + 1] - tok.offsets_[a];
      const size_t lb = tok.offsets_[b + 1] - tok.offsets_[b];
      return la != lb ? la > lb : a < b;
    });
  }
  return tok;
}

size_t Tokenizer::find_added(std::string_view text, size_t pos, bool parse_special,
                             int32_t& id) const {
  for (; pos < text.size(); ++pos) {
    const auto& candidates = added_by_first_byte_[static_cast<uint8_t>(text[pos])];
    for (const int32_t candidate : candidates) {
      if (!parse_special && types_[candidate] == TokenType::kControl) continue;
      const std::string_view t = token_bytes(candidate);
      if (text.compare(pos, t.size(), t) == 0) {
        id = candidate;
        return pos;
      }
    }
  }
  return std::string_view::npos;
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (options_.nfc) text = normalize_nfc(text, normalized);
  pre_tokenizer_.split(text, [&](std::string_view piece) { bpe_.encode_word(piece, out); });
}

void Tokenizer::encode(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    append_utf8_lossy(text, repaired, false);
    text = repaired;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t id = -1;
    const size_t start = find_added(text, pos, parse_special, id);
    if (start == std::string_view::npos) break;
    encode_text(text.substr(pos, start - pos), out);
    out.push_back(id);
    pos = start + token_bytes(id).size();
  }
  encode_text(text.substr(pos), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, parse_special, out);
  return out;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("tokenizer: token id {} is outside [0, {})", id, n_vocab());
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) out += token_bytes(id);
  return out;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view text) const {
  const auto it = added_.find(std::string(text));
  if (it == added_.end()) return std::nullopt;
  return it->second;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_->token_bytes(id);
  std::string out;
  const size_t held = append_utf8_lossy(pending_, out, true);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace qwenrt::tokenizer
