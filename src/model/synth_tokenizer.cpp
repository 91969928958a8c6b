// The synthetic tokenizer of `qwenrt synth` (model/synth.h): byte tokens, random word-like
// merges and Qwen3.5's added tokens at their real ids.
#include <cctype>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "model/synth.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace qwenrt::model {
namespace {

// Qwen3.5's added tokens, in id order from 248044 (tools/tokenizer/qwen_vocab.py has the same
// list, from the released tokenizer). Indexes 14..25 are not special in HF's tokenizer.json;
// llama.cpp's converter still marks the <|...|> ones control, the others user-defined.
constexpr const char* kAddedTokens[] = {
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
};
constexpr int kNumAdded = static_cast<int>(std::size(kAddedTokens));
constexpr int kRealVocabRows = 248320;
constexpr int kRealNormalTokens = 248044;

}  // namespace

SynthTokenizer synthetic_tokenizer(int n_vocab, uint64_t seed) {
  if (n_vocab < 256 + kNumAdded) {
    fail("synth: a tokenizer needs at least {} vocabulary rows, got {}", 256 + kNumAdded, n_vocab);
  }
  const int n_normal = n_vocab == kRealVocabRows ? kRealNormalTokens : n_vocab - kNumAdded;
  SynthTokenizer tok;
  tok.tokens.reserve(n_vocab);
  tok.types.reserve(n_vocab);
  tok.merges.reserve(n_normal - 256);
  auto spell = [](uint8_t byte) {
    std::string s;
    tokenizer::append_utf8(tokenizer::byte_level::kByteToCodepoint[byte], s);
    return s;
  };
  // Byte tokens in GPT-2's order: the printable bytes, then the rest, each in byte order.
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      if (tokenizer::byte_level::is_printable(b) == (pass == 0)) {
        tok.tokens.push_back(spell(static_cast<uint8_t>(b)));
      }
    }
  }
  // Merges over a word-like alphabet (letters, digits, a few marks, with or without a leading
  // space), biased towards early tokens as real merge lists are; no space inside a token, so
  // every merge can fire under the qwen35 pre-tokenizer. Text outside the alphabet stays bytes.
  std::unordered_set<std::string> seen(tok.tokens.begin(), tok.tokens.end());
  std::vector<int32_t> word_start, word_rest;  // ids that may start / continue a token
  const std::string space = spell(' ');
  for (int id = 0; id < 256; ++id) {
    const std::string& t = tok.tokens[id];
    const bool alnum = t.size() == 1 && std::isalnum(static_cast<unsigned char>(t[0]));
    if (alnum || t == "'" || t == "-" || t == ".") word_rest.push_back(id);
    if (alnum || t == space) word_start.push_back(id);
  }
  std::mt19937_64 rng(seed ^ 0x746f6b656e697a65ull);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto pick = [&](const std::vector<int32_t>& from) {
    const double u = unit(rng);
    return from[static_cast<size_t>(u * u * u * static_cast<double>(from.size()))];
  };
  while (static_cast<int>(tok.tokens.size()) < n_normal) {
    const int32_t left = pick(word_start), right = pick(word_rest);
    std::string merged = tok.tokens[left] + tok.tokens[right];
    if (merged.size() > 24 || !seen.insert(merged).second) continue;
    tok.merges.push_back(tok.tokens[left] + " " + tok.tokens[right]);
    const auto id = static_cast<int32_t>(tok.tokens.size());
    tok.tokens.push_back(std::move(merged));
    word_start.push_back(id);
    if (tok.tokens[id].rfind(space, 0) != 0) word_rest.push_back(id);
  }
  tok.types.assign(tok.tokens.size(), 1);
  for (int i = 0; i < kNumAdded; ++i) {
    const std::string text = kAddedTokens[i];
    const bool user_defined = i >= 14 && i <= 25 && text.rfind("<|", 0) != 0;
    tok.tokens.push_back(text);
    tok.types.push_back(user_defined ? 4 : 3);
  }
  tok.padding_id = n_normal;  // <|endoftext|>
  tok.eos_id = n_normal + 2;  // <|im_end|>, the only end-of-generation token the files name
  while (static_cast<int>(tok.tokens.size()) < n_vocab) {
    tok.tokens.push_back(fmt::format("[PAD{}]", tok.tokens.size()));
    tok.types.push_back(5);
  }
  return tok;
}

}  // namespace qwenrt::model
