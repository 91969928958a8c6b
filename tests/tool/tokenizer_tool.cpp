// tokenizer_tool: the driver tests/python/tokenizer_parity.py and bench/tokenizer/ run.
//
//   tokenizer_tool encode MODEL.gguf IN.bin OUT.jsonl [--no-nfc]
//       IN.bin: records of (u8 flags: bit 0 = parse_special, u32 LE length, bytes). One JSON line
//       per record: {"ids": [...], "decoded": HEX, "stream": HEX}, where decoded is decode(ids)
//       and stream the StreamDecoder's output for the ids pushed one at a time, then finish().
//   tokenizer_tool pretokenize IN.bin OUT.jsonl
//       Same records in (valid UTF-8); one JSON line per record: the qwen35 pre-tokenizer's
//       pieces, each as HEX.
//   tokenizer_tool nfc IN.bin OUT.bin
//       Same records in; records of (u32 LE length, NFC bytes) out. Input must be valid UTF-8.
//   tokenizer_tool bench MODEL.gguf TEXT REPEATS
//       Encodes the whole file TEXT (parse_special off) REPEATS times; prints one JSON line with
//       the load time, token count and the median encode time.
//
// Failures print one line, "tokenizer_tool: error: ...", and exit 1 (2 for usage errors).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/reader.h"
#include "tokenizer/nfc.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tool_main.h"

namespace {

using qwenrt::fail;
using qwenrt::tool::read_file;
using qwenrt::tool::write_file;
namespace tk = qwenrt::tokenizer;

struct Record {
  bool parse_special;
  std::string_view text;
};

std::vector<Record> parse_records(const std::string& path, std::string_view data) {
  std::vector<Record> records;
  size_t pos = 0;
  while (pos < data.size()) {
    if (data.size() - pos < 5) fail("{}: record header cut short at byte {}", path, pos);
    const auto flags = static_cast<uint8_t>(data[pos]);
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i)
      length |= uint32_t{static_cast<uint8_t>(data[pos + 1 + i])} << (8 * i);
    pos += 5;
    if (data.size() - pos < length) fail("{}: record at byte {} runs past the end", path, pos - 5);
    records.push_back({(flags & 1) != 0, data.substr(pos, length)});
    pos += length;
  }
  return records;
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    out += kDigits[static_cast<uint8_t>(c) >> 4];
    out += kDigits[static_cast<uint8_t>(c) & 15];
  }
  return out;
}

tk::Tokenizer load(const std::string& path, const tk::Options& options = {}) {
  auto file = qwenrt::gguf::File::open(path);
  return tk::Tokenizer::from_gguf(file.value(), options);
}

int cmd_encode(const std::vector<std::string>& args) {
  tk::Options options;
  for (size_t i = 3; i < args.size(); ++i) {
    if (args[i] != "--no-nfc") fail("encode: unknown option '{}'", args[i]);
    options.nfc = false;
  }
  const tk::Tokenizer tokenizer = load(args[0], options);
  const std::string data = read_file(args[1]);
  std::string out;
  for (const Record& r : parse_records(args[1], data)) {
    const std::vector<int32_t> ids = tokenizer.encode(r.text, r.parse_special);
    tk::StreamDecoder stream(tokenizer);
    std::string streamed;
    out += "{\"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ", ";
      out += std::to_string(ids[i]);
      streamed += stream.push(ids[i]);
    }
    streamed += stream.finish();
    out += "], \"decoded\": \"" + hex(tokenizer.decode(ids)) + "\", \"stream\": \"" +
           hex(streamed) + "\"}\n";
  }
  write_file(args[2], out);
  return 0;
}

int cmd_nfc(const std::vector<std::string>& args) {
  const std::string data = read_file(args[0]);
  std::string out;
  std::string storage;
  for (const Record& r : parse_records(args[0], data)) {
    const std::string_view normalized = tk::normalize_nfc(r.text, storage);
    const auto length = static_cast<uint32_t>(normalized.size());
    for (int i = 0; i < 4; ++i) out += static_cast<char>(length >> (8 * i) & 0xFF);
    out += normalized;
  }
  write_file(args[1], out);
  return 0;
}

int cmd_pretokenize(const std::vector<std::string>& args) {
  const std::string data = read_file(args[0]);
  const tk::PreTokenizer pre_tokenizer;
  std::string out;
  for (const Record& r : parse_records(args[0], data)) {
    out += "[";
    bool first = true;
    pre_tokenizer.split(r.text, [&](std::string_view piece) {
      out += first ? "\"" : ", \"";
      out += hex(piece) + "\"";
      first = false;
    });
    out += "]\n";
  }
  write_file(args[1], out);
  return 0;
}

int cmd_bench(const std::vector<std::string>& args) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto file = qwenrt::gguf::File::open(args[0]);
  const auto t1 = Clock::now();
  const tk::Tokenizer tokenizer = tk::Tokenizer::from_gguf(file.value());
  const double open_s = std::chrono::duration<double>(t1 - t0).count();
  const double load_s = std::chrono::duration<double>(Clock::now() - t1).count();
  const std::string text = read_file(args[1]);
  const int repeats = std::stoi(args[2]);
  if (repeats < 1) fail("bench: REPEATS must be at least 1, got {}", repeats);
  std::vector<double> seconds;
  size_t n_tokens = 0;
  std::vector<int32_t> ids;
  for (int i = 0; i < repeats; ++i) {
    ids.clear();
    const auto start = Clock::now();
    tokenizer.encode(text, false, ids);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    n_tokens = ids.size();
  }
  std::sort(seconds.begin(), seconds.end());
  std::printf(
      "{\"gguf_open_s\": %.6f, \"from_gguf_s\": %.6f, \"bytes\": %zu, \"tokens\": %zu, "
      "\"median_s\": %.6f, \"min_s\": %.6f}\n",
      open_s, load_s, text.size(), n_tokens, seconds[seconds.size() / 2], seconds.front());
  return 0;
}

constexpr qwenrt::tool::Command kCommands[] = {
    {"encode", "MODEL.gguf IN.bin OUT.jsonl [--no-nfc]", 3, 4, cmd_encode},
    {"nfc", "IN.bin OUT.bin", 2, 2, cmd_nfc},
    {"pretokenize", "IN.bin OUT.jsonl", 2, 2, cmd_pretokenize},
    {"bench", "MODEL.gguf TEXT REPEATS", 3, 3, cmd_bench},
};

}  // namespace

int main(int argc, char** argv) {
  return qwenrt::tool::tool_main("tokenizer_tool", kCommands, argc, argv);
}
