#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qwenrt::tokenizer {
namespace {

using gguf::Value;
using gguf::ValueType;

// Byte-level spelling of raw bytes, as vocabularies store normal tokens.
std::string spell(std::string_view bytes) {
  std::string out;
  for (const char c : bytes)
    append_utf8(byte_level::kByteToCodepoint[static_cast<uint8_t>(c)], out);
  return out;
}

// A small vocabulary: the 256 byte tokens (ids 0..255, id = byte), then one token per merge
// (merged in the order given), then the added tokens.
struct VocabSpec {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
  std::vector<std::pair<std::string, int>> added;           // text, token type (3 or 4)
};

VocabSpec default_spec() {
  return {{{"h", "e"},
           {"l", "l"},
           {"he", "ll"},
           {"hell", "o"},
           {" ", "w"},
           {"o", "r"},
           {" w", "or"},
           {"1", "2"},
           {"a", "a"},
           {"\xF0", "\x9F"}},
          {{"<|im_start|>", 3},
           {"<|im_end|>", 3},
           {"<|endoftext|>", 3},
           {"<think>", 4},
           {"</think>", 4},
           {"<x>", 4},
           {"<x><y>", 4}}};
}

struct Metadata {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
};

Metadata metadata_of(const VocabSpec& spec) {
  Metadata m;
  for (int b = 0; b < 256; ++b) {
    m.tokens.push_back(spell(std::string(1, static_cast<char>(b))));
    m.types.push_back(1);
  }
  for (const auto& [left, right] : spec.merges) {
    m.tokens.push_back(spell(left + right));
    m.types.push_back(1);
    m.merges.push_back(spell(left) + " " + spell(right));
  }
  for (const auto& [text, type] : spec.added) {
    m.tokens.push_back(text);
    m.types.push_back(type);
  }
  return m;
}

gguf::Writer writer_of(const Metadata& m) {
  gguf::Writer w;
  w.set("general.architecture", Value::str("qwen35"));
  w.set("tokenizer.ggml.model", Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::str("qwen35"));
  w.set("tokenizer.ggml.tokens", Value::strings(m.tokens));
  std::vector<Value> types;
  for (const int32_t t : m.types) types.push_back(Value::i32(t));
  w.set("tokenizer.ggml.token_type", Value::array(ValueType::INT32, std::move(types)));
  w.set("tokenizer.ggml.merges", Value::strings(m.merges));
  return w;
}

gguf::File file_of(const gguf::Writer& w) {
  auto file = gguf::File::from_bytes(w.to_bytes(), "vocab.gguf");
  EXPECT_TRUE(file.ok()) << file.error();
  return std::move(file).value();
}

Tokenizer make(const VocabSpec& spec = default_spec(), const Options& options = {}) {
  return Tokenizer::from_gguf(file_of(writer_of(metadata_of(spec))), options);
}

// What from_gguf says about metadata changed by `edit`; "" when it loads.
template <class Edit>
std::string load_error(Edit edit) {
  Metadata m = metadata_of(default_spec());
  gguf::Writer w = writer_of(m);
  edit(m, w);
  try {
    (void)Tokenizer::from_gguf(file_of(w));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int32_t id_of(std::string_view bytes) {
  const Metadata m = metadata_of(default_spec());
  for (size_t i = 0; i < m.tokens.size(); ++i) {
    if (m.types[i] == 1 && m.tokens[i] == spell(bytes)) return static_cast<int32_t>(i);
  }
  ADD_FAILURE() << "no token " << bytes;
  return -1;
}

std::vector<int32_t> bytes_ids(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (const char c : bytes) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(Tokenizer, MergesApplyByRankLeftmostFirst) {
  const Tokenizer tok = make();
  EXPECT_EQ(tok.encode("hello", false), std::vector<int32_t>{id_of("hello")});
  EXPECT_EQ(tok.encode("hello world", false),
            (std::vector<int32_t>{id_of("hello"), id_of(" wor"), 'l', 'd'}));
  EXPECT_EQ(tok.encode("aaa", false), (std::vector<int32_t>{id_of("aa"), 'a'}));  // leftmost
  EXPECT_EQ(tok.encode("", true), std::vector<int32_t>{});                        // no BOS, ever
  // Every digit is its own pre-token, so the merge "1 2" never applies.
  EXPECT_EQ(tok.encode("12", false), (std::vector<int32_t>{'1', '2'}));

  // The same merges in the other order give other tokens: rank decides, not length.
  const Tokenizer ab_first = make({{{"a", "b"}, {"b", "c"}}, {}});
  const Tokenizer bc_first = make({{{"b", "c"}, {"a", "b"}}, {}});
  EXPECT_EQ(ab_first.encode("abc", false), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(bc_first.encode("abc", false), (std::vector<int32_t>{'a', 256}));
}

// Plain rank-BPE over strings: the definition the fast paths must agree with.
std::vector<std::string> reference_bpe(
    const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> parts;
  for (const char c : word) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = ranks.find({parts[i], parts[i + 1]});
      if (it != ranks.end() && it->second < best_rank) best_rank = it->second, best = i;
    }
    if (best_rank == INT32_MAX) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return parts;
}

TEST(Tokenizer, ShortAndLongWordsMergeLikeTheReference) {
  // Random merges over {a, b, c}; words of 2..300 letters exercise both merge paths.
  std::mt19937 rng(7);
  VocabSpec spec;
  std::vector<std::string> pieces = {"a", "b", "c"};
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::map<std::string, int32_t> ids = {{"a", 'a'}, {"b", 'b'}, {"c", 'c'}};
  while (spec.merges.size() < 60) {
    const std::string l = pieces[rng() % pieces.size()], r = pieces[rng() % pieces.size()];
    if (ranks.count({l, r}) || ids.count(l + r) || (l + r).size() > 12) continue;
    ranks[{l, r}] = static_cast<int>(spec.merges.size());
    ids[l + r] = 256 + static_cast<int32_t>(spec.merges.size());
    spec.merges.emplace_back(l, r);
    pieces.push_back(l + r);
  }
  const Tokenizer tok = make(spec);
  for (int trial = 0; trial < 400; ++trial) {
    std::string word(2 + rng() % 300, 'a');
    for (char& c : word) c = static_cast<char>('a' + rng() % 3);
    std::vector<int32_t> expected;
    for (const std::string& part : reference_bpe(word, ranks)) expected.push_back(ids.at(part));
    ASSERT_EQ(tok.encode(word, false), expected) << word;
  }
}

TEST(Tokenizer, AddedTokensAndParseSpecial) {
  const Tokenizer tok = make();
  const int32_t im_start = *tok.token_id("<|im_start|>");
  const int32_t think = *tok.token_id("<think>");
  EXPECT_EQ(tok.token_type(im_start), TokenType::kControl);
  EXPECT_EQ(tok.token_type(think), TokenType::kUserDefined);
  EXPECT_FALSE(tok.token_id("<|nope|>"));
  EXPECT_FALSE(tok.token_id("hello"));  // only added tokens resolve by text

  // Control tokens only with parse_special; user text stays literal text without it.
  EXPECT_EQ(tok.encode("<|im_start|>hello", true),
            (std::vector<int32_t>{im_start, id_of("hello")}));
  std::vector<int32_t> literal = bytes_ids("<|im_start|>");
  literal.push_back(id_of("hello"));
  EXPECT_EQ(tok.encode("<|im_start|>hello", false), literal);
  // User-defined tokens are matched either way (HF matches non-special added tokens always).
  EXPECT_EQ(tok.encode("<think>hello", false), (std::vector<int32_t>{think, id_of("hello")}));
  // Leftmost, then longest: "<x><y>" beats "<x>".
  EXPECT_EQ(tok.encode("a<x><y><x>", true),
            (std::vector<int32_t>{'a', *tok.token_id("<x><y>"), *tok.token_id("<x>")}));
  // Text around specials is tokenized on its own: no "l l" merge across the boundary.
  EXPECT_EQ(tok.encode("hel<|im_end|>lo", true),
            (std::vector<int32_t>{id_of("he"), 'l', *tok.token_id("<|im_end|>"), 'l', 'o'}));
}

TEST(Tokenizer, DecodeRoundTripsValidText) {
  const Tokenizer tok = make();
  for (const std::string s : {"hello world", "<|im_start|>user\nhi<|im_end|>",
                              "🦙 llama 中文 ☃", "  \t\n\r\n x'S 12 3 ", ""}) {
    EXPECT_EQ(tok.decode(tok.encode(s, true)), s);
    EXPECT_EQ(tok.decode(tok.encode(s, false)), s);
  }
  EXPECT_THROW((void)tok.decode(std::vector<int32_t>{tok.n_vocab()}), Error);
  EXPECT_THROW((void)tok.decode(std::vector<int32_t>{-1}), Error);
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikeHf) {
  const Tokenizer tok = make();
  // Each maximal subpart becomes one U+FFFD: "\xF0\x9F" is one, "\xED\xA0\x80" (a surrogate) three.
  EXPECT_EQ(tok.decode(tok.encode("a\xF0\x9F"
                                  "b",
                                  false)),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tok.decode(tok.encode("\xED\xA0\x80", false)), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok.encode("x\xFFy", false), tok.encode("x\xEF\xBF\xBDy", false));
  EXPECT_EQ(utf8_lossy("\xC0\xAF\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizer, NfcLikeHfUnlessDisabled) {
  const Tokenizer tok = make();
  EXPECT_EQ(tok.encode("e\xCC\x81", false), tok.encode("\xC3\xA9", false));  // e + U+0301 = é
  const Tokenizer raw = make(default_spec(), {.nfc = false});
  EXPECT_EQ(raw.encode("e\xCC\x81", false), (std::vector<int32_t>{'e', 0xCC, 0x81}));
}

TEST(StreamDecoder, HoldsSplitCharactersBack) {
  const Tokenizer tok = make();
  // 🦙 is F0 9F A6 99: the merge "\xF0 \x9F" makes it three tokens, none a whole character.
  const std::vector<int32_t> ids = tok.encode("a🦙b", false);
  ASSERT_EQ(ids, (std::vector<int32_t>{'a', id_of("\xF0\x9F"), 0xA6, 0x99, 'b'}));
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "a");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "🦙");
  EXPECT_EQ(stream.push(ids[4]), "b");
  EXPECT_EQ(stream.finish(), "");
}

TEST(StreamDecoder, FlushesInvalidBytesAsReplacement) {
  const Tokenizer tok = make();
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(0xFF), "\xEF\xBF\xBD");  // can never start a character: out at once
  EXPECT_EQ(stream.push(id_of("\xF0\x9F")), "");
  EXPECT_EQ(stream.push('x'), "\xEF\xBF\xBDx");  // F0 9F cut short by 'x': one U+FFFD
  EXPECT_EQ(stream.push(0xE2), "");
  EXPECT_EQ(stream.push(0x82), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");  // unfinished at the end: one U+FFFD
  EXPECT_EQ(stream.push('y'), "y");            // usable again after finish()

  // On any id sequence the stream gives exactly the lossy decode.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids(rng() % 12);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 300) % tok.n_vocab();
    StreamDecoder s(tok);
    std::string out;
    for (const int32_t id : ids) out += s.push(id);
    out += s.finish();
    ASSERT_EQ(out, utf8_lossy(tok.decode(ids)));
  }
}

TEST(Tokenizer, EncodeIsSafeFromManyThreads) {
  const Tokenizer tok = make();
  const std::vector<std::string> texts = {"hello world", "<think>hel<|im_end|>lo", "e\xCC\x81 aaa",
                                          "a\xF0\x9F", std::string(200, 'a') + "12 world"};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok.encode(t, true));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches = 0;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        const size_t k = static_cast<size_t>(i) % texts.size();
        if (tok.encode(texts[k], true) != expected[k]) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, 0);
}

TEST(Tokenizer, BrokenMetadataIsAClearError) {
  using W = gguf::Writer;
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  EXPECT_EQ(load_error([](Metadata&, W&) {}), "");

  std::string e = load_error([](Metadata&, W& w) { w = W(); });
  EXPECT_TRUE(has(e, "tokenizer.ggml.model") && has(e, "missing")) << e;
  e = load_error([](Metadata&, W& w) { w.set("tokenizer.ggml.model", Value::str("llama")); });
  EXPECT_TRUE(has(e, "expected 'gpt2'") && has(e, "'llama'")) << e;
  e = load_error([](Metadata&, W& w) { w.set("tokenizer.ggml.pre", Value::str("qwen2")); });
  EXPECT_TRUE(has(e, "tokenizer.ggml.pre") && has(e, "'qwen2'")) << e;
  e = load_error([](Metadata&, W& w) { w.set("tokenizer.ggml.pre", Value::u32(3)); });
  EXPECT_TRUE(has(e, "tokenizer.ggml.pre")) << e;
  e = load_error([](Metadata&, W& w) {
    w.set("tokenizer.ggml.tokens", Value::array(ValueType::INT32, {Value::i32(1)}));
  });
  EXPECT_TRUE(has(e, "tokenizer.ggml.tokens") && has(e, "array of string") &&
              has(e, "array of int32"))
      << e;
  e = load_error([](Metadata& m, W& w) {
    m.types.pop_back();
    std::vector<Value> types;
    for (const int32_t t : m.types) types.push_back(Value::i32(t));
    w.set("tokenizer.ggml.token_type", Value::array(ValueType::INT32, std::move(types)));
  });
  EXPECT_TRUE(has(e, "tokenizer.ggml.token_type") && has(e, "expected")) << e;
  e = load_error([](Metadata& m, W& w) {
    m.types[300 % m.types.size()] = 9;
    std::vector<Value> types;
    for (const int32_t t : m.types) types.push_back(Value::i32(t));
    w.set("tokenizer.ggml.token_type", Value::array(ValueType::INT32, std::move(types)));
  });
  EXPECT_TRUE(has(e, "is 9")) << e;
  e = load_error([](Metadata& m, W& w) {
    m.merges.push_back(spell("q") + " " + spell("zz"));
    w.set("tokenizer.ggml.merges", Value::strings(m.merges));
  });
  EXPECT_TRUE(has(e, "tokenizer.ggml.merges[10]") && has(e, "'zz'") && has(e, "not a normal token"))
      << e;
  e = load_error([](Metadata& m, W& w) {
    m.merges.push_back("ab");
    w.set("tokenizer.ggml.merges", Value::strings(m.merges));
  });
  EXPECT_TRUE(has(e, "two tokens separated by one space")) << e;
  e = load_error([](Metadata& m, W& w) {
    m.merges.push_back(m.merges[0]);
    w.set("tokenizer.ggml.merges", Value::strings(m.merges));
  });
  EXPECT_TRUE(has(e, "repeats")) << e;
  e = load_error([](Metadata& m, W& w) {
    m.tokens[' '] = "x y";  // not byte-level text: a literal space is not in the alphabet
    w.set("tokenizer.ggml.tokens", Value::strings(m.tokens));
  });
  EXPECT_TRUE(has(e, "token 32") && has(e, "byte-level")) << e;
  e = load_error([](Metadata& m, W& w) {
    m.tokens['A'] = spell("AB");  // byte 0x41 loses its token
    w.set("tokenizer.ggml.tokens", Value::strings(m.tokens));
  });
  EXPECT_TRUE(has(e, "byte 0x41")) << e;
  e = load_error([](Metadata& m, W& w) {
    m.tokens.back() = m.tokens[m.tokens.size() - 2];
    w.set("tokenizer.ggml.tokens", Value::strings(m.tokens));
  });
  EXPECT_TRUE(has(e, "are both")) << e;
}

}  // namespace
}  // namespace qwenrt::tokenizer
