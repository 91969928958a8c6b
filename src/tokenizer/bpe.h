// The BPE merge loop over token ids: a word's bytes start as their single-byte tokens, and the
// adjacent pair with the lowest merge rank (leftmost on ties) is merged until none is left, as
// HF tokenizers' BPE model does.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace qwenrt::tokenizer {

class Bpe {
 public:
  void set_byte_token(uint8_t byte, int32_t id) { byte_token_[byte] = id; }
  // Rank = position in tokenizer.ggml.merges. Returns false (and changes nothing) when the pair
  // already has a merge.
  bool add_merge(int32_t left, int32_t right, int32_t merged, int32_t rank);
  void reserve(size_t n_merges);

  // Appends the tokens of one pre-tokenized piece (raw bytes) to `out`.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return uint64_t{static_cast<uint32_t>(left)} << 32 | static_cast<uint32_t>(right);
  }
  const Merge* find(int32_t left, int32_t right) const;
  void grow();
  void encode_short(std::string_view bytes, std::vector<int32_t>& out) const;
  void encode_long(std::string_view bytes, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_token_{};
  // Open addressing, linear probing; kEmpty marks a free slot (ids are below 2^31, so no pair
  // key equals it).
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t size_ = 0;
  int shift_ = 64;
};

}  // namespace qwenrt::tokenizer
