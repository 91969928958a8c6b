// Byte-level BPE tokenizer (GGUF tokenizer.ggml.model = "gpt2", pre = "qwen35"), matching HF
// tokenizers on the tokenizer.json it was converted from.
//
// encode(text): (1) invalid UTF-8 is repaired to U+FFFD (utf8.h); (2) added tokens are cut out,
// leftmost-longest: user-defined ones (<think>, <tool_call>, ...) always, control ones
// (<|im_start|>, ...) only with parse_special; (3) each stretch between them is NFC-normalised,
// (4) split by the qwen35 pre-tokenizer, (5) mapped to bytes' tokens and merged by rank. No BOS,
// ever. decode(ids) concatenates the tokens' bytes; StreamDecoder turns ids into UTF-8 as they
// come.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/reader.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"

namespace qwenrt::tokenizer {

// tokenizer.ggml.token_type values (llama.cpp's numbering).
enum class TokenType : uint8_t {
  kNormal = 1,       // a BPE vocabulary entry, stored in byte-level form
  kUnknown = 2,      // never produced by encode; decodes to nothing
  kControl = 3,      // added token matched only with parse_special (<|im_end|>)
  kUserDefined = 4,  // added token matched always (<think>, as HF does for non-special ones)
  kUnused = 5,       // padding rows ([PAD248077]); never produced; decodes to nothing
};

struct Options {
  // HF's tokenizer.json for Qwen3.5 normalises with NFC; llama.cpp skips it. false reproduces
  // llama.cpp (and the shared qwen35-tokenizer-cases fixture).
  bool nfc = true;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model, pre, tokens, token_type, merges}. Broken metadata (a key
  // missing or of the wrong type, lengths that disagree, a merge naming an unknown token, a
  // token that is not byte-level text) throws Error naming the key, index and the values.
  static Tokenizer from_gguf(const gguf::File& file, const Options& options = {});

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  void encode(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;

  // The bytes of the tokens, concatenated (not necessarily valid UTF-8 when a character is split
  // across ids; StreamDecoder and utf8_lossy() handle that). Control and user-defined tokens give
  // their text; unknown and unused ones nothing. An id outside [0, n_vocab()) throws Error.
  std::string decode(std::span<const int32_t> ids) const;
  std::string_view token_bytes(int32_t id) const;

  // The id of an added token (control or user-defined) by its text: "<|im_end|>", "<think>".
  std::optional<int32_t> token_id(std::string_view text) const;
  TokenType token_type(int32_t id) const;
  int32_t n_vocab() const { return static_cast<int32_t>(types_.size()); }

 private:
  Tokenizer() = default;
  void check_id(int32_t id) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  // Where the next added token starts in text[pos..], and which; npos when none.
  size_t find_added(std::string_view text, size_t pos, bool parse_special, int32_t& id) const;

  Options options_;
  PreTokenizer pre_tokenizer_;
  Bpe bpe_;
  std::vector<TokenType> types_;
  std::string bytes_;              // every token's bytes, back to back
  std::vector<uint32_t> offsets_;  // token i is bytes_[offsets_[i], offsets_[i + 1])
  std::unordered_map<std::string, int32_t> added_;  // control + user-defined, by text
  // Added tokens by first byte, longest first: the candidates tried at each position.
  std::vector<std::vector<int32_t>> added_by_first_byte_;
};

// Turns ids into UTF-8 text as they arrive: a character split across tokens is held back until
// its last byte comes; bytes that cannot form a character become U+FFFD (utf8.h's rule) as soon as
// that is certain, and finish() turns a character left unfinished into one U+FFFD. The
// concatenated output is exactly utf8_lossy(tokenizer.decode(all ids)).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  std::string push(int32_t id);
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // at most 3 bytes of an unfinished character
};

}  // namespace qwenrt::tokenizer
