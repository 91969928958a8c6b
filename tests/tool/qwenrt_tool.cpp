// qwenrt_tool: small helpers the Python cross-checks (tests/python/) drive, one subcommand each.
//
//   qwenrt_tool dequant TYPE IN.bin OUT.f32     raw blocks in, little-endian float32 out
//   qwenrt_tool quantize TYPE IN.f32 OUT.bin    little-endian float32 in, raw blocks out
//   qwenrt_tool split IN.gguf PREFIX TENSORS    IN as a split GGUF of TENSORS tensors a part
//                                               (gguf/split.h), the parts' paths printed
//
// Adding a subcommand is one function and one line in kCommands. Failures print one line,
// "qwenrt_tool: error: ...", and exit 1 (2 for usage errors).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "gguf/split.h"
#include "quant/quant.h"
#include "tool_main.h"

namespace {

using qwenrt::DType;
using qwenrt::fail;
using qwenrt::tool::read_file;
using qwenrt::tool::write_file;

DType parse_type(std::string_view name) {
  auto type = qwenrt::dtype_from_name(name);
  if (!type) fail("unknown type name '{}'", name);
  return *type;
}

// dequant TYPE IN.bin OUT.f32
int cmd_dequant(const std::vector<std::string>& args) {
  const DType type = parse_type(args[0]);
  const std::string blocks = read_file(args[1]);
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
  const std::string raw = read_file(args[1]);
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

// split IN.gguf PREFIX TENSORS
int cmd_split(const std::vector<std::string>& args) {
  const auto file = qwenrt::gguf::File::open(args[0]).value();
  const uint64_t per_part = std::stoull(args[2]);
  for (const auto& path : qwenrt::gguf::write_split(file, args[1], {.max_part_tensors = per_part}))
    std::puts(path.c_str());
  return 0;
}

constexpr qwenrt::tool::Command kCommands[] = {
    {"dequant", "TYPE IN.bin OUT.f32", 3, 3, cmd_dequant},
    {"quantize", "TYPE IN.f32 OUT.bin", 3, 3, cmd_quantize},
    {"split", "IN.gguf PREFIX TENSORS", 3, 3, cmd_split},
};

}  // namespace

int main(int argc, char** argv) {
  return qwenrt::tool::tool_main("qwenrt_tool", kCommands, argc, argv);
}
