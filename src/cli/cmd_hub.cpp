// `qwenrt pull NAME [--drafter mtp|dflash]`: download into the Hugging Face cache without running.
// `qwenrt ls [--json]`: the GGUF files in the cache, with sizes.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_option.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "hub/cache.h"
#include "hub/model_ref.h"
#include "hub/progress.h"

namespace qwenrt::cli {
namespace {

struct PullOptions {
  std::string name;
  std::string drafter;  // "", "mtp", "dflash"
};

int run_pull(const PullOptions& opt) {
  const hub::HubOptions hub = cli_hub_options();
  const hub::Resolved trunk = hub::resolve(hub::parse_model_ref(opt.name, true), hub);
  fmt::print(stderr, "qwenrt: {} {}/{} (commit {})\n",
             trunk.downloaded ? "downloaded" : "already cached", trunk.repo, trunk.file,
             trunk.commit);
  std::puts(trunk.path.c_str());
  if (!opt.drafter.empty()) {
    const auto kind = opt.drafter == "mtp" ? hub::SidecarKind::kMtp : hub::SidecarKind::kDflash;
    const auto sidecar = hub::resolve_sidecar(trunk, kind, hub);
    if (!sidecar)
      fail("{}: {} has no {}*.gguf drafter", opt.name, trunk.repo, hub::sidecar_prefix(kind));
    std::puts(sidecar->path.c_str());
  }
  return 0;
}

// What to pass to -m for a cached file: the official name where it is one.
std::string model_name(const hub::CachedFile& f) {
  // A split GGUF by the name its parts share ("x-Q8_0-00001-of-00003.gguf" is "x-Q8_0.gguf").
  const auto split = gguf::parse_split_name(f.file);
  const std::string file = f.parts > 1 && split ? split->stem + ".gguf" : f.file;
  for (const auto& r : hub::official_repos()) {
    const std::string quant = hub::quant_of(file);
    if (r.repo == f.repo && !quant.empty() && r.file(quant) == file) return r.name + ":" + quant;
  }
  return f.repo + ":" + f.file;
}

int run_ls(bool json) {
  const hub::HubOptions hub = hub::hub_options(hub::process_env());
  const hub::CacheListing listing = hub::list_cache(hub.cache_dir);
  if (json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : listing.files) {
      files.push_back({{"model", model_name(f)},
                       {"repo", f.repo},
                       {"file", f.file},
                       {"commit", f.commit},
                       {"refs", f.refs},
                       {"size", f.size},
                       {"path", f.path}});
      if (f.parts > 1) {
        files.back()["parts"] = f.parts;
        files.back()["parts_cached"] = f.parts_cached;
      }
    }
    std::puts(nlohmann::json({{"cache_dir", hub.cache_dir},
                              {"files", files},
                              {"partial_downloads", listing.partial_count},
                              {"partial_bytes", listing.partial_bytes}})
                  .dump(1)
                  .c_str());
    return 0;
  }
  uint64_t total = 0;
  size_t width = 5;
  for (const auto& f : listing.files) width = std::max(width, model_name(f).size());
  if (!listing.files.empty())
    fmt::print("{:<{}}  {:>10}  {:<12}  {}\n", "MODEL", width, "SIZE", "COMMIT", "REFS");
  for (const auto& f : listing.files) {
    std::string refs;
    for (const auto& r : f.refs) refs += (refs.empty() ? "" : ",") + r;
    const std::string parts =
        f.parts == 1 ? ""
        : f.parts_cached == f.parts
            ? fmt::format("  ({} parts)", f.parts)
            : fmt::format("  ({} of {} parts cached: pull it again)", f.parts_cached, f.parts);
    fmt::print("{:<{}}  {:>10}  {:<12}  {}{}\n", model_name(f), width, hub::human_size(f.size),
               f.commit.substr(0, 12), refs.empty() ? "-" : refs, parts);
    total += f.size;
  }
  fmt::print("{} GGUF file{}, {} in {}\n", listing.files.size(),
             listing.files.size() == 1 ? "" : "s", hub::human_size(total), hub.cache_dir);
  if (listing.partial_count > 0)
    fmt::print("{} partial download{} ({}), resumed by the next pull\n", listing.partial_count,
               listing.partial_count == 1 ? "" : "s", hub::human_size(listing.partial_bytes));
  return 0;
}

}  // namespace

Run add_pull(CLI::App& app) {
  auto opt = std::make_shared<PullOptions>();
  auto* sub = app.add_subcommand(
      "pull", "Download a model into the Hugging Face cache, without running it");
  sub->add_option("name", opt->name,
                  "Checkpoint name (Qwen3.6-27B[:QUANT]) or ORG/REPO[:FILE|:QUANT]")
      ->required();
  sub->add_option("--drafter", opt->drafter, "Also fetch the repo's drafter sidecar")
      ->check(CLI::IsMember({"mtp", "dflash"}));
  return [opt] { return run_pull(*opt); };
}

Run add_ls(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand("ls", "List the GGUF files in the Hugging Face cache, with sizes");
  sub->add_flag("--json", *json, "As JSON");
  return [json] { return run_ls(*json); };
}

}  // namespace qwenrt::cli
