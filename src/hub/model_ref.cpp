#include "hub/model_ref.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "gguf/reader.h"
#include "hub/cache.h"

namespace qwenrt::hub {
namespace {

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with_ci(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         upper(s.substr(s.size() - suffix.size())) == upper(std::string(suffix));
}

std::string base_name(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

// The name without ".gguf", cut at '-' and '.'.
std::vector<std::string> name_tokens(const std::string& file) {
  std::string stem = base_name(file);
  if (ends_with_ci(stem, ".gguf")) stem.resize(stem.size() - 5);
  std::vector<std::string> tokens;
  std::string cur;
  for (char c : stem) {
    if (c == '-' || c == '.') {
      tokens.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  tokens.push_back(cur);
  return tokens;
}

// Q4_K_M, IQ4_XS, Q8_0, F16, BF16, MXFP4_MOE ...: what llama.cpp's quantize names its types.
bool looks_like_quant(const std::string& token) {
  const std::string t = upper(token);
  if (t == "F16" || t == "BF16" || t == "F32" || t.rfind("MXFP4", 0) == 0) return true;
  size_t i = t.rfind("IQ", 0) == 0 ? 2 : (t.rfind("Q", 0) == 0 || t.rfind("TQ", 0) == 0 ? 1 : 0);
  if (i == 0) return false;
  if (t[0] == 'T') i = 2;
  if (i >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i]))) return false;
  return std::all_of(t.begin() + i, t.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) ||
           std::isupper(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool has_token(const std::string& file, const std::string& quant) {
  const std::string q = upper(quant);
  for (const auto& t : name_tokens(file)) {
    if (upper(t) == q) return true;
  }
  return false;
}

std::string quants_in(const std::vector<std::string>& files) {
  std::vector<std::string> quants;
  for (const auto& f : files) {
    if (!ends_with_ci(f, ".gguf") || file_role(f) != FileRole::kTrunk) continue;
    std::string q = quant_of(f);
    if (!q.empty() && std::find(quants.begin(), quants.end(), q) == quants.end())
      quants.push_back(q);
  }
  if (quants.empty()) return "no GGUF files";
  std::string out;
  for (const auto& q : quants) out += (out.empty() ? "" : ", ") + q;
  return out;
}

// Fewest folders, then the shortest name: the plain file among "x-Q4_K_M.gguf" and
// "UD/x-UD-Q4_K_M.gguf". Error when two tie.
std::string pick_plainest(const std::string& repo, std::vector<std::string> candidates,
                          const std::string& what) {
  auto key = [](const std::string& f) {
    return std::make_pair(std::count(f.begin(), f.end(), '/'), f.size());
  };
  std::sort(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) {
    return key(a) < key(b) || (key(a) == key(b) && a < b);
  });
  if (candidates.size() > 1 && key(candidates[0]) == key(candidates[1])) {
    std::string list;
    for (const auto& c : candidates) list += (list.empty() ? "" : ", ") + c;
    fail("{}: {} matches several files ({}): name one as {}:FILE", repo, what, list, repo);
  }
  return candidates.front();
}

}  // namespace

std::string OfficialRepo::file(const std::string& quant) const {
  return name + "-" + quant + ".gguf";
}

const std::vector<OfficialRepo>& official_repos() {
  // ggml-org's blessed conversions, named by its convention (repo <Name>-GGUF, files
  // <Name>-<QUANT>.gguf). SPEC.md names the checkpoints, not the repos: the names here are the
  // convention's, recorded as an assumption in docs/decisions.md; fix them here and nowhere else.
  static const std::vector<OfficialRepo> repos = [] {
    std::vector<OfficialRepo> r;
    for (auto c : {model::Checkpoint::kQwen36_27B, model::Checkpoint::kQwen36_35B_A3B,
                   model::Checkpoint::kQwen38_27B}) {
      const std::string name = model::checkpoint_name(c);
      r.push_back({c, name, "ggml-org/" + name + "-GGUF"});
    }
    return r;
  }();
  return repos;
}

const OfficialRepo* official_repo(std::string_view name) {
  for (const auto& r : official_repos()) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

const char* sidecar_prefix(SidecarKind kind) {
  return kind == SidecarKind::kMtp ? "mtp-" : "dflash-";
}

FileRole file_role(const std::string& file) {
  const std::string base = upper(base_name(file));
  if (base.rfind("MMPROJ", 0) == 0) return FileRole::kMmproj;
  if (base.rfind("MTP-", 0) == 0) return FileRole::kMtp;
  if (base.rfind("DFLASH-", 0) == 0) return FileRole::kDflash;
  return FileRole::kTrunk;
}

std::string quant_of(const std::string& file) {
  const auto tokens = name_tokens(file);
  for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) {
    if (looks_like_quant(*it)) return upper(*it);
  }
  return "";
}

ModelRef parse_model_ref(const std::string& text, bool hub_only) {
  ModelRef ref;
  ref.asked = text;
  if (text.empty()) fail("empty model name");
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  const std::string tail = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (!hub_only) {
    // An existing file wins; so does anything spelled like a path that cannot be a hub name.
    std::error_code ec;
    const bool exists = std::filesystem::exists(text, ec);
    const bool hub_like =
        official_repo(name) != nullptr ||
        (std::count(name.begin(), name.end(), '/') == 1 && !ends_with_ci(name, ".gguf"));
    if (exists || text.front() == '.' || text.front() == '/' || text.front() == '~' ||
        (!hub_like && ends_with_ci(text, ".gguf"))) {
      if (!exists) fail("{}: no such file", text);
      if (file_role(text) == FileRole::kMmproj)
        fail("{}: an mmproj file is a vision projector; qwenrt runs text models only", text);
      ref.is_path = true;
      ref.path = text;
      return ref;
    }
  }
  if (colon != std::string::npos && tail.empty()) fail("{}: nothing after ':'", text);

  if (const OfficialRepo* official = official_repo(name)) {
    if (ends_with_ci(tail, ".gguf"))
      fail("{}: an official name takes a quant (:Q8_0), not a file; for a file use {}:{}", text,
           official->repo, tail);
    ref.official = official->checkpoint;
    ref.repo = official->repo;
    ref.quant = tail.empty() ? kDefaultQuant : upper(tail);
    ref.file = official->file(ref.quant);
    return ref;
  }
  if (name.find('/') == std::string::npos) {
    std::string known;
    const OfficialRepo* near = nullptr;
    for (const auto& r : official_repos()) {
      known += (known.empty() ? "" : ", ") + r.name;
      if (upper(r.name) == upper(name)) near = &r;
    }
    if (near)
      fail("{}: unknown model name (names are case-sensitive: did you mean {}?)", text, near->name);
    fail("{}: not a file, not a checkpoint name ({}) and not a Hugging Face repo (ORG/NAME)", text,
         known);
  }
  check_repo_id(name);
  ref.repo = name;
  if (ends_with_ci(tail, ".gguf")) {
    check_repo_file(tail);
    if (file_role(tail) == FileRole::kMmproj)
      fail("{}: an mmproj file is a vision projector; qwenrt runs text models only", text);
    ref.file = tail;
  } else {
    ref.quant = tail.empty() ? kDefaultQuant : upper(tail);
  }
  return ref;
}

std::string choose_quant_file(const std::string& repo, const std::vector<std::string>& files,
                              const std::string& quant) {
  std::vector<std::string> candidates;  // whole files and first parts
  for (const auto& f : files) {
    if (!ends_with_ci(f, ".gguf") || file_role(f) != FileRole::kTrunk || !has_token(f, quant))
      continue;
    const auto part = gguf::parse_split_name(f);
    if (!part || part->index == 0) candidates.push_back(f);
  }
  if (candidates.empty())
    fail("{}: no {} GGUF in the repo (it has: {})", repo, quant, quants_in(files));
  const std::string chosen = pick_plainest(repo, candidates, quant);
  if (const auto part = gguf::parse_split_name(chosen)) {
    for (uint64_t i = 0; i < part->count; ++i) {
      if (std::find(files.begin(), files.end(), part->path(i)) == files.end())
        fail("{}: {} is split into {} parts, but the repo has no {}", repo, chosen, part->count,
             part->path(i));
    }
  }
  return chosen;
}

std::optional<std::string> choose_sidecar_file(const std::string& repo,
                                               const std::vector<std::string>& files,
                                               SidecarKind kind, const std::string& quant) {
  const FileRole role = kind == SidecarKind::kMtp ? FileRole::kMtp : FileRole::kDflash;
  std::vector<std::string> all, same_quant;
  for (const auto& f : files) {
    if (!ends_with_ci(f, ".gguf") || file_role(f) != role) continue;
    all.push_back(f);
    if (!quant.empty() && has_token(f, quant)) same_quant.push_back(f);
  }
  if (!same_quant.empty())
    return pick_plainest(repo, same_quant, std::string(sidecar_prefix(kind)) + quant);
  if (all.empty()) return std::nullopt;
  return pick_plainest(repo, all, std::string(sidecar_prefix(kind)) + "*.gguf");
}

}  // namespace qwenrt::hub
