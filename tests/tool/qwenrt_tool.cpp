// qwenrt_tool: small helpers the Python cross-checks (tests/python/) drive, one subcommand each.
//
//   qwenrt_tool dequant TYPE IN.bin OUT.f32     raw blocks in, little-endian float32 out
//   qwenrt_tool quantize TYPE IN.f32 OUT.bin    little-endian float32 in, raw blocks out
//
// Adding a subcommand is one function and one line in kCommands. Failures print one line,
// "qwenrt_tool: error: ...", and exit 1 (2 for usage errors).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant.h"

namespace {

using qwenrt::DType;
using qwenrt::fail;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open for reading", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  if (in.bad()) fail("{}: read error", path);
  return bytes;
}

void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot open for writing", path);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) fail("{}: write error", path);
}

DType parse_type(std::string_view name) {
  auto type = qwenrt::dtype_from_name(name);
  if (!type) fail("unknown type name '{}'", name);
  return *type;
}

// dequant TYPE IN.bin OUT.f32
int cmd_dequant(const std::vector<std::string>& args) {
  const DType type = parse_type(args[0]);
  const std::vector<uint8_t> blocks = read_file(args[1]);
  const auto& t = qwenrt::traits(type);
  if (blocks.size() % t.block_bytes != 0) {
    fail("{}: {} bytes is not a whole number of {} blocks ({} bytes each)", args[1], blocks.size(),
         t.name, t.block_bytes);
  }
  const auto n = static_cast<int64_t>(blocks.size() / t.block_bytes * t.block_elems);
  std::vector<float> out(static_cast<size_t>(n));
  qwenrt::quant::dequantize(type, blocks.data(), out.data(), n, args[1]);
  write_file(args[2], out.data(), out.size() * sizeof(float));
  return 0;
}

// quantize TYPE IN.f32 OUT.bin
int cmd_quantize(const std::vector<std::string>& args) {
  const DType type = parse_type(args[0]);
  const std::vector<uint8_t> raw = read_file(args[1]);
  if (raw.size() % sizeof(float) != 0) {
    fail("{}: {} bytes is not a whole number of float32 values", args[1], raw.size());
  }
  std::vector<float> values(raw.size() / sizeof(float));
  if (!raw.empty()) std::memcpy(values.data(), raw.data(), raw.size());
  const auto& t = qwenrt::traits(type);
  const auto n = static_cast<int64_t>(values.size());
  std::vector<uint8_t> out(static_cast<size_t>(n / t.block_elems * t.block_bytes));
  qwenrt::quant::quantize(type, values.data(), out.data(), n, args[1]);
  write_file(args[2], out.data(), out.size());
  return 0;
}

struct Command {
  std::string_view name;
  std::string_view usage;  // arguments after the name
  size_t n_args;
  int (*run)(const std::vector<std::string>& args);
};

constexpr Command kCommands[] = {
    {"dequant", "TYPE IN.bin OUT.f32", 3, cmd_dequant},
    {"quantize", "TYPE IN.f32 OUT.bin", 3, cmd_quantize},
};

int usage() {
  std::fprintf(stderr, "usage:\n");
  for (const auto& c : kCommands) {
    std::fprintf(stderr, "  qwenrt_tool %.*s %.*s\n", static_cast<int>(c.name.size()),
                 c.name.data(), static_cast<int>(c.usage.size()), c.usage.data());
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string_view name = argv[1];
  for (const auto& c : kCommands) {
    if (c.name != name) continue;
    std::vector<std::string> args(argv + 2, argv + argc);
    if (args.size() != c.n_args) {
      std::fprintf(stderr, "qwenrt_tool: error: %s expects %zu arguments: %.*s\n", argv[1],
                   c.n_args, static_cast<int>(c.usage.size()), c.usage.data());
      return 2;
    }
    try {
      return c.run(args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "qwenrt_tool: error: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "qwenrt_tool: error: unknown subcommand '%s'\n", argv[1]);
  return usage();
}
