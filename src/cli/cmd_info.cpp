// `qwenrt info MODEL.gguf [--tensors] [--json]`: what a GGUF file holds.
#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "gguf/file_type.h"
#include "gguf/json.h"
#include "gguf/reader.h"

namespace qwenrt::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool tensors = false;
  bool json = false;
};

std::string human_bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.2f} KiB", n / double(1ull << 10));
  return fmt::format("{} B", n);
}

int run_info(const InfoOptions& opt) {
  gguf::File file = gguf::File::open(opt.model).value();
  if (opt.json) {
    std::puts(
        gguf::to_json(file).dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  const auto arch = file.get_string("general.architecture");
  const auto name = file.get_string("general.name");
  const auto file_type = file.get_uint("general.file_type");
  fmt::print("file:          {} ({} bytes, GGUF v{})\n", file.path(), file.file_size(),
             file.version());
  fmt::print("architecture:  {}\n", arch.value_or("(missing general.architecture)"));
  fmt::print("name:          {}\n", name.value_or("(none)"));
  fmt::print("file type:     {}\n", file_type ? gguf::file_type_name(*file_type) : "(none)");

  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (count, bytes)
  uint64_t total = 0;
  for (const auto& t : file.tensors()) {
    auto& [count, bytes] = by_type[std::string(dtype_name(t.dtype))];
    ++count;
    bytes += t.n_bytes;
    total += t.n_bytes;
  }
  fmt::print("tensors:       {} ({})\n", file.tensors().size(), human_bytes(total));
  for (const auto& [type, cb] : by_type) {
    fmt::print("  {:<8} {:>6} tensors  {:>12}\n", type, cb.first, human_bytes(cb.second));
  }
  fmt::print("metadata:      {} keys\n", file.metadata().size());
  for (const auto& kv : file.metadata()) {
    fmt::print("  {} = {}\n", kv.key, kv.value.to_display());
  }
  if (opt.tensors) {
    fmt::print("{:<48} {:<8} {:<28} {:>14}\n", "name", "type", "shape", "offset");
    for (const auto& t : file.tensors()) {
      fmt::print("{:<48} {:<8} {:<28} {:>14}\n", t.name, dtype_name(t.dtype), t.shape_string(),
                 file.data_offset() + t.offset);
    }
  }
  return 0;
}

}  // namespace

Run add_info(CLI::App& app) {
  auto opt = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "Show a GGUF file's architecture, metadata and tensors");
  sub->add_option("model", opt->model, "GGUF file")->required();
  sub->add_flag("--tensors", opt->tensors,
                "Print the full tensor table (name, type, shape, offset)");
  sub->add_flag("--json", opt->json, "Print metadata and tensor table as JSON (arrays complete)");
  return [opt] { return run_info(*opt); };
}

}  // namespace qwenrt::cli
