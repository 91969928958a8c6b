#include "hub/cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <system_error>
#include <tuple>

#include "core/error.h"
#include "gguf/reader.h"

namespace qwenrt::hub {
namespace fs = std::filesystem;
namespace {

std::string strip(std::string s) {
  auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && space(s.back())) s.pop_back();
  size_t start = 0;
  while (start < s.size() && space(s[start])) ++start;
  return s.substr(start);
}

std::string home_cache(const Env& env) {
  if (auto xdg = env("XDG_CACHE_HOME")) return *xdg;
  if (auto home = env("HOME")) return *home + "/.cache";
  fail(
      "cannot find the Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is "
      "set");
}

std::string hf_home(const Env& env) {
  if (auto home = env("HF_HOME")) return *home;
  return home_cache(env) + "/huggingface";
}

std::optional<std::string> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A name beside `path` no other writer (process or thread) uses at the same time.
std::string private_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.{}.{}.tmp", path, getpid(), counter++);
}

// Writes `text` to `path` through a temporary file and a rename, so a reader never sees half.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = private_name(path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) fail("{}: could not write", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("{}: could not move into place: {}", path, ec.message());
}

}  // namespace

std::string cache_dir(const Env& env) {
  if (auto dir = env("HF_HUB_CACHE")) return *dir;
  if (auto dir = env("HUGGINGFACE_HUB_CACHE")) return *dir;
  if (auto home = env("HF_HOME")) return *home + "/hub";
  return home_cache(env) + "/huggingface/hub";
}

std::optional<std::string> access_token(const Env& env) {
  for (const char* name : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    if (auto token = env(name)) {
      std::string t = strip(*token);
      if (!t.empty()) return t;
    }
  }
  const std::string path = env("HF_TOKEN_PATH").value_or(hf_home(env) + "/token");
  if (auto text = read_whole(path)) {
    std::string t = strip(*text);
    if (!t.empty()) return t;
  }
  return std::nullopt;
}

std::string llama_cpp_cache_dir(const Env& env) {
  if (auto dir = env("LLAMA_CACHE")) return *dir;
  if (auto xdg = env("XDG_CACHE_HOME")) return *xdg + "/llama.cpp";
  if (auto home = env("HOME")) return *home + "/.cache/llama.cpp";
  return "";
}

std::string llama_cpp_cache_path(const std::string& dir, const std::string& repo,
                                 const std::string& file) {
  std::string name = repo + "_" + file;
  std::replace(name.begin(), name.end(), '/', '_');
  return dir + "/" + name;
}

void check_repo_id(const std::string& repo) {
  const size_t slash = repo.find('/');
  auto part_ok = [](std::string_view part) {
    if (part.empty() || !std::isalnum(static_cast<unsigned char>(part.front()))) return false;
    return std::all_of(part.begin(), part.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
  };
  const bool ok = slash != std::string::npos && repo.find('/', slash + 1) == std::string::npos &&
                  part_ok(std::string_view(repo).substr(0, slash)) &&
                  part_ok(std::string_view(repo).substr(slash + 1)) &&
                  repo.find("--") == std::string::npos && repo.find("..") == std::string::npos &&
                  repo.size() <= 96;
  if (!ok)
    fail(
        "'{}' is not a Hugging Face repo id (ORG/NAME: letters, digits, '-', '_', '.'; no '--' "
        "or '..')",
        repo);
}

void check_repo_file(const std::string& file) {
  bool ok = !file.empty() && file.front() != '/' && file.find('\\') == std::string::npos &&
            file.find('\0') == std::string::npos;
  for (size_t start = 0; ok && start <= file.size();) {
    size_t end = file.find('/', start);
    if (end == std::string::npos) end = file.size();
    const std::string_view part = std::string_view(file).substr(start, end - start);
    ok = !part.empty() && part != "." && part != "..";
    start = end + 1;
  }
  if (!ok) fail("'{}' is not a file path inside a repo", file);
}

std::string repo_folder(const std::string& repo) {
  std::string folder = "models--";
  for (char c : repo) {
    if (c == '/')
      folder += "--";
    else
      folder += c;
  }
  return folder;
}

bool is_commit_hash(const std::string& text) {
  return text.size() == 40 && std::all_of(text.begin(), text.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

RepoCache::RepoCache(std::string cache_dir, std::string repo)
    : root_(std::move(cache_dir)), repo_(std::move(repo)) {
  check_repo_id(repo_);
}

std::string RepoCache::dir() const {
  return root_ + "/" + repo_folder(repo_);
}
std::string RepoCache::blob_path(const std::string& etag) const {
  return dir() + "/blobs/" + etag;
}
std::string RepoCache::incomplete_path(const std::string& etag) const {
  return blob_path(etag) + ".incomplete";
}
std::string RepoCache::lock_path(const std::string& etag) const {
  return root_ + "/.locks/" + repo_folder(repo_) + "/" + etag + ".lock";
}
std::string RepoCache::snapshot_path(const std::string& commit, const std::string& file) const {
  return dir() + "/snapshots/" + commit + "/" + file;
}

std::optional<std::string> RepoCache::commit_of(const std::string& revision) const {
  if (auto text = read_whole(dir() + "/refs/" + revision)) {
    std::string commit = strip(*text);
    if (!commit.empty()) return commit;
  }
  if (is_commit_hash(revision)) return revision;
  return std::nullopt;
}

std::optional<std::string> RepoCache::cached_file(const std::string& revision,
                                                  const std::string& file) const {
  const auto commit = commit_of(revision);
  if (!commit) return std::nullopt;
  const std::string path = snapshot_path(*commit, file);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;  // follows the link: a dangling one is no file
  return std::nullopt;
}

std::vector<std::string> RepoCache::snapshot_files(const std::string& commit) const {
  std::vector<std::string> files;
  const fs::path base = dir() + "/snapshots/" + commit;
  std::error_code ec;
  if (!fs::is_directory(base, ec)) return files;
  for (auto it = fs::recursive_directory_iterator(base, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (fs::is_regular_file(it->path(), ec2))
      files.push_back(it->path().lexically_relative(base).generic_string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void RepoCache::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;
  check_repo_file(revision);  // branch names may hold '/': refs/pr/1
  const fs::path ref = dir() + "/refs/" + revision;
  std::error_code ec;
  fs::create_directories(ref.parent_path(), ec);
  if (ec) fail("{}: could not create the folder: {}", ref.parent_path().string(), ec.message());
  if (auto old = read_whole(ref); old && *old == commit) return;
  write_atomically(ref, commit);
}

void RepoCache::link_snapshot(const std::string& commit, const std::string& file,
                              const std::string& etag) const {
  const fs::path link = snapshot_path(commit, file);
  std::error_code ec;
  fs::create_directories(link.parent_path(), ec);
  if (ec) fail("{}: could not create the folder: {}", link.parent_path().string(), ec.message());
  // snapshots/<commit>/<dirs...>/<name>: one "../" per folder below the repo folder.
  std::string target;
  for (size_t depth = 2 + std::count(file.begin(), file.end(), '/'); depth > 0; --depth)
    target += "../";
  target += "blobs/" + etag;
  // Made aside and renamed over: another download of the same file may be linking it too.
  const std::string tmp = private_name(link.string());
  fs::create_symlink(target, tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);
  if (ec) {
    fs::remove(tmp);
    fail("{}: could not link to {}: {}", link.string(), target, ec.message());
  }
}

CacheListing list_cache(const std::string& cache) {
  CacheListing listing;
  std::error_code ec;
  if (!fs::is_directory(cache, ec)) return listing;
  for (const auto& entry : fs::directory_iterator(cache, ec)) {
    const std::string folder = entry.path().filename().string();
    if (folder.rfind("models--", 0) != 0 || !entry.is_directory()) continue;
    std::string repo = folder.substr(8);
    for (size_t at; (at = repo.find("--")) != std::string::npos;) repo.replace(at, 2, "/");
    // Which refs point at which snapshot.
    std::vector<std::pair<std::string, std::string>> refs;  // (ref, commit)
    const fs::path refs_dir = entry.path() / "refs";
    std::error_code ec2;
    if (fs::is_directory(refs_dir, ec2)) {
      for (auto it = fs::recursive_directory_iterator(refs_dir, ec2);
           !ec2 && it != fs::recursive_directory_iterator(); it.increment(ec2)) {
        if (!it->is_regular_file()) continue;
        if (auto text = read_whole(it->path().string()))
          refs.emplace_back(it->path().lexically_relative(refs_dir).generic_string(), strip(*text));
      }
    }
    const fs::path snapshots = entry.path() / "snapshots";
    if (fs::is_directory(snapshots, ec2)) {
      for (const auto& snap : fs::directory_iterator(snapshots, ec2)) {
        const std::string commit = snap.path().filename().string();
        for (auto it = fs::recursive_directory_iterator(snap.path(), ec2);
             !ec2 && it != fs::recursive_directory_iterator(); it.increment(ec2)) {
          std::error_code ec3;
          const fs::path p = it->path();
          if (p.extension() != ".gguf" || !fs::is_regular_file(p, ec3)) continue;
          CachedFile f;
          f.repo = repo;
          f.file = p.lexically_relative(snap.path()).generic_string();
          f.commit = commit;
          f.path = p.string();
          f.size = fs::file_size(p, ec3);
          for (const auto& [ref, c] : refs) {
            if (c == commit) f.refs.push_back(ref);
          }
          listing.files.push_back(std::move(f));
        }
      }
    }
    const fs::path blobs = entry.path() / "blobs";
    if (fs::is_directory(blobs, ec2)) {
      for (const auto& blob : fs::directory_iterator(blobs, ec2)) {
        std::error_code ec3;
        if (blob.path().extension() == ".incomplete" && blob.is_regular_file(ec3)) {
          ++listing.partial_count;
          listing.partial_bytes += blob.file_size(ec3);
        }
      }
    }
  }
  // A split GGUF's parts become one entry under the name of its first part.
  std::vector<CachedFile> files;
  std::map<std::tuple<std::string, std::string, std::string>, size_t> sets;  // first part -> entry
  for (auto& f : listing.files) {
    const auto part = gguf::parse_split_name(f.file);
    if (!part || part->count == 1) {
      files.push_back(std::move(f));
      continue;
    }
    const std::string first = part->path(0);
    const auto [it, added] = sets.try_emplace({f.repo, f.commit, first}, files.size());
    if (added) {
      CachedFile set = f;
      set.file = first;
      set.path = (fs::path(f.path).parent_path() / fs::path(first).filename()).string();
      set.size = 0;
      set.parts = static_cast<int>(part->count);
      set.parts_cached = 0;
      files.push_back(std::move(set));
    }
    files[it->second].size += f.size;
    ++files[it->second].parts_cached;
  }
  listing.files = std::move(files);
  std::sort(listing.files.begin(), listing.files.end(), [](const auto& a, const auto& b) {
    return std::tie(a.repo, a.file, a.commit) < std::tie(b.repo, b.file, b.commit);
  });
  return listing;
}

}  // namespace qwenrt::hub
