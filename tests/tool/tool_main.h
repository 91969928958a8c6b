// What the test tools share: whole-file reads and writes, and main() for a tool made of
// subcommands, each one function and one line in the tool's command table. Failures print
// "TOOL: error: ..." and exit 1 (2 for usage errors).
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qwenrt::tool {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open for reading", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("{}: read error", path);
  return bytes;
}

inline void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot open for writing", path);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) fail("{}: write error", path);
}

inline void write_file(const std::string& path, std::string_view bytes) {
  write_file(path, bytes.data(), bytes.size());
}

struct Command {
  std::string_view name;
  std::string_view usage;  // the arguments after the name
  size_t min_args, max_args;
  int (*run)(const std::vector<std::string>& args);
};

// Runs the subcommand argv[1] names with the arguments after it.
inline int tool_main(std::string_view tool, std::span<const Command> commands, int argc,
                     char** argv) {
  auto usage = [&] {
    fmt::print(stderr, "usage:\n");
    for (const Command& c : commands) fmt::print(stderr, "  {} {} {}\n", tool, c.name, c.usage);
    return 2;
  };
  if (argc < 2) return usage();
  const std::string_view name = argv[1];
  for (const Command& c : commands) {
    if (c.name != name) continue;
    const std::vector<std::string> args(argv + 2, argv + argc);
    if (args.size() < c.min_args || args.size() > c.max_args) {
      const std::string count = c.min_args == c.max_args
                                    ? fmt::format("{}", c.min_args)
                                    : fmt::format("{} to {}", c.min_args, c.max_args);
      fmt::print(stderr, "{}: error: {} expects {} arguments: {}\n", tool, name, count, c.usage);
      return 2;
    }
    try {
      return c.run(args);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}: error: {}\n", tool, e.what());
      return 1;
    }
  }
  fmt::print(stderr, "{}: error: unknown subcommand '{}'\n", tool, name);
  return usage();
}

}  // namespace qwenrt::tool
