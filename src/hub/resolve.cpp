#include "hub/resolve.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/reader.h"
#include "hub/cache.h"
#include "hub/progress.h"

namespace qwenrt::hub {
namespace fs = std::filesystem;
namespace {

std::string percent_encode(const std::string& text, bool keep_slash) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/'))
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// huggingface_hub's _normalize_etag: W/ prefix and quotes off.
std::string normalize_etag(std::string etag) {
  if (etag.rfind("W/", 0) == 0) etag = etag.substr(2);
  while (!etag.empty() && etag.front() == '"') etag.erase(etag.begin());
  while (!etag.empty() && etag.back() == '"') etag.pop_back();
  return etag;
}

bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

struct FileMetadata {
  std::string commit;
  std::string etag;
  uint64_t size = 0;
  std::string location;  // where the bytes are (the CDN), or the resolve URL itself
};

HttpOptions http_options(const HubOptions& o) {
  return {.token = o.token,
          .connect_timeout_s = o.connect_timeout_s,
          .low_speed_timeout_s = o.stall_timeout_s};
}

// The one-line error for an HTTP error answer about `what` (repo, or repo/file).
[[noreturn]] void fail_http(const std::string& asked, const std::string& repo,
                            const std::string& what, const HttpResponse& r, const HubOptions& o) {
  const std::string code = r.header("x-error-code");
  const std::string message = r.header("x-error-message");
  const std::string detail = message.empty() ? "" : " (" + message + ")";
  if (r.status == 401 || r.status == 403) {
    if (code == "GatedRepo")
      fail("{}: {} is gated: accept its terms on the hub and use a token with access (HTTP {}){}",
           asked, repo, r.status, detail);
    fail("{}: {} not found, or private and {} (HTTP {}){}", asked, repo,
         o.token ? "the token sent has no access to it" : "needs a token (set HF_TOKEN)", r.status,
         detail);
  }
  if (r.status == 404) {
    if (code == "EntryNotFound")
      throw MissingFileError(fmt::format("{}: {} has no file {}{}", asked, repo, what, detail));
    if (code == "RevisionNotFound") fail("{}: {} has no such revision{}", asked, repo, detail);
    fail("{}: {} not found on {} (HTTP 404){}", asked, repo, o.endpoint, detail);
  }
  fail("{}: the hub answered HTTP {} for {}{}", asked, r.status, r.url, detail);
}

// HEAD on the resolve URL, following redirects on the hub's own origin (renamed repos) and
// stopping at the first one elsewhere (the CDN): the file's metadata is on that answer.
HttpResponse head_metadata(const std::string& url, const HubOptions& o) {
  std::string at = url;
  HttpOptions http = http_options(o);
  const std::string hub = url_origin(o.endpoint);
  for (int hop = 0; hop < 10; ++hop) {
    HttpResponse r = http_request("HEAD", at, http, 0);
    const std::string location = r.header("location");
    if (r.status < 300 || r.status >= 400 || location.empty()) return r;
    const std::string next = resolve_location(at, location);
    if (url_origin(next) != hub) {
      r.headers["location"] = next;
      return r;
    }
    at = next;
  }
  fail("{}: more than 10 redirects", url);
}

FileMetadata parse_metadata(const std::string& asked, const std::string& url,
                            const HttpResponse& r) {
  FileMetadata m;
  m.commit = r.header("x-repo-commit");
  std::string etag = r.header("x-linked-etag");
  if (etag.empty()) etag = r.header("etag");
  m.etag = normalize_etag(etag);
  std::string size = r.header("x-linked-size");
  const bool redirect = r.status >= 300 && r.status < 400;
  if (size.empty() && !redirect) size = r.header("content-length");
  m.location = r.header("location").empty() ? url : r.header("location");
  if (m.commit.empty()) fail("{}: the hub's answer for {} has no X-Repo-Commit header", asked, url);
  if (m.etag.empty()) fail("{}: the hub's answer for {} has no ETag", asked, url);
  if (m.etag.find('/') != std::string::npos || m.etag.find("..") != std::string::npos)
    fail("{}: the hub's ETag for {} is not usable as a file name: {}", asked, url, m.etag);
  if (!is_commit_hash(m.commit))
    fail("{}: the hub's X-Repo-Commit for {} is not a commit hash: {}", asked, url, m.commit);
  try {
    size_t used = 0;
    m.size = std::stoull(size, &used);
    if (used != size.size()) throw std::invalid_argument(size);
  } catch (const std::exception&) {
    fail("{}: the hub's answer for {} gives no file size (X-Linked-Size / Content-Length: '{}')",
         asked, url, size);
  }
  return m;
}

// flock on huggingface_hub's lock file for the blob, so two downloads of it (ours or its) do not
// write the same .incomplete file.
class BlobLock {
 public:
  BlobLock(const std::string& path, const std::function<void(const std::string&)>& notice) {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot open the lock file", path);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (notice) notice("waiting for another download of the same file (" + path + ")");
      if (::flock(fd_, LOCK_EX) != 0) fail("{}: cannot lock", path);
    }
  }
  ~BlobLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

Resolved cached_result(const RepoCache& cache, const std::string& revision, const std::string& file,
                       const std::string& path) {
  return {.path = path,
          .repo = cache.repo(),
          .revision = revision,
          .commit = cache.commit_of(revision).value_or(""),
          .file = file};
}

// The file llama.cpp's `-hf` left in its flat cache, if any (and, when `meta` is known, only if its
// size and any ETag llama.cpp noted beside it agree with the hub's).
std::optional<std::string> llama_cpp_file(const HubOptions& o, const std::string& repo,
                                          const std::string& file, const FileMetadata* meta) {
  if (o.llama_cache_dir.empty()) return std::nullopt;
  const std::string path = llama_cpp_cache_path(o.llama_cache_dir, repo, file);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  if (meta == nullptr) return path;
  if (fs::file_size(path, ec) != meta->size) return std::nullopt;
  std::ifstream etag_file(path + ".etag");
  std::string etag;
  if (etag_file && std::getline(etag_file, etag) && normalize_etag(etag) != meta->etag)
    return std::nullopt;
  return path;
}

Resolved from_llama_cpp(const std::string& repo, const std::string& revision,
                        const std::string& file, const std::string& path, const HubOptions& o) {
  if (o.notice) o.notice(fmt::format("using llama.cpp's cached {}", path));
  return {.path = path, .repo = repo, .revision = revision, .file = file};
}

// One file of a repo: cached, or fetched into the cache.
Resolved resolve_file(const std::string& asked, const std::string& repo,
                      const std::string& revision, const std::string& file, const HubOptions& o) {
  check_repo_file(file);
  if (file_role(file) == FileRole::kMmproj)
    fail("{}: {} is a vision projector (mmproj); qwenrt runs text models only", asked, file);
  RepoCache cache(o.cache_dir, repo);
  const auto cached = cache.cached_file(revision, file);
  if (o.offline) {
    if (cached) return cached_result(cache, revision, file, *cached);
    if (auto llama = llama_cpp_file(o, repo, file, nullptr))
      return from_llama_cpp(repo, revision, file, *llama, o);
    fail("{}: {}/{} is not in the Hugging Face cache ({}) and HF_HUB_OFFLINE is set", asked, repo,
         file, o.cache_dir);
  }
  const std::string url = resolve_url(o.endpoint, repo, revision, file);
  HttpResponse head;
  try {
    head = head_metadata(url, o);
  } catch (const NetworkError& e) {
    if (cached) {
      if (o.notice)
        o.notice(fmt::format("hub unreachable ({}); using the cached {}", e.what(), *cached));
      return cached_result(cache, revision, file, *cached);
    }
    if (auto llama = llama_cpp_file(o, repo, file, nullptr))
      return from_llama_cpp(repo, revision, file, *llama, o);
    fail("{}: cannot reach the hub and {}/{} is not cached: {}", asked, repo, file, e.what());
  }
  if (head.status >= 400) {
    // As huggingface_hub: a server error is no answer about the file, so the cache stands.
    if (head.status >= 500 && cached) {
      if (o.notice)
        o.notice(
            fmt::format("the hub answered HTTP {}; using the cached {}", head.status, *cached));
      return cached_result(cache, revision, file, *cached);
    }
    fail_http(asked, repo, file, head, o);
  }
  const FileMetadata meta = parse_metadata(asked, url, head);

  Resolved result{.path = cache.snapshot_path(meta.commit, file),
                  .repo = repo,
                  .revision = revision,
                  .commit = meta.commit,
                  .file = file};
  const std::string blob = cache.blob_path(meta.etag);
  auto blob_ready = [&] {
    std::error_code ec;
    return fs::is_regular_file(blob, ec) && fs::file_size(blob, ec) == meta.size;
  };
  if (!blob_ready()) {
    if (auto llama = llama_cpp_file(o, repo, file, &meta)) {
      Resolved r = from_llama_cpp(repo, revision, file, *llama, o);
      r.commit = meta.commit;
      return r;
    }
    std::error_code ec;
    fs::create_directories(fs::path(blob).parent_path(), ec);
    if (ec)
      fail("{}: cannot create {}: {}", asked, fs::path(blob).parent_path().string(), ec.message());
    BlobLock lock(cache.lock_path(meta.etag), o.notice);
    if (!blob_ready()) {
      const std::string incomplete = cache.incomplete_path(meta.etag);
      if (o.notice) {
        const uint64_t have =
            fs::is_regular_file(incomplete, ec) ? fs::file_size(incomplete, ec) : 0;
        o.notice(have > 0 ? fmt::format("resuming {}/{} at {} of {}", repo, file, human_size(have),
                                        human_size(meta.size))
                          : fmt::format("downloading {}/{} ({}) into {}", repo, file,
                                        human_size(meta.size), o.cache_dir));
      }
      DownloadSpec spec{
          .url = meta.location,
          .incomplete_path = incomplete,
          .size = meta.size,
          .sha256 = is_hex(meta.etag, 64) ? meta.etag : "",
          .git_sha1 = is_hex(meta.etag, 40) ? meta.etag : "",
          .label = asked == repo + "/" + file ? asked : asked + " (" + repo + "/" + file + ")",
          .relocate = [&] {
            // The hub's answer again: a new signed link to the same bytes.
            const HttpResponse again = head_metadata(url, o);
            if (again.status >= 400) fail_http(asked, repo, file, again, o);
            const FileMetadata fresh = parse_metadata(asked, url, again);
            if (fresh.etag != meta.etag)
              fail("{}: {}/{} changed on the hub during the download (ETag {} -> {}): run again",
                   asked, repo, file, meta.etag, fresh.etag);
            if (o.notice)
              o.notice(fmt::format("the download link expired; resuming from a new one"));
            return fresh.location;
          }};
      download(spec, {.http = http_options(o),
                      .token_origin = url_origin(o.endpoint),
                      .retries = o.retries,
                      .retry_delay_s = o.retry_delay_s,
                      .progress = o.progress});
      fs::rename(incomplete, blob, ec);
      if (ec) fail("{}: cannot move {} into place: {}", asked, incomplete, ec.message());
      result.downloaded = true;
    }
  }
  cache.link_snapshot(meta.commit, file, meta.etag);
  cache.write_ref(revision, meta.commit);
  return result;
}

}  // namespace

HubOptions hub_options(const Env& env) {
  HubOptions o;
  o.cache_dir = cache_dir(env);
  o.llama_cache_dir = llama_cpp_cache_dir(env);
  o.endpoint =
      env("QWENRT_HF_ENDPOINT").value_or(env("HF_ENDPOINT").value_or("https://huggingface.co"));
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  o.token = access_token(env);
  o.offline = env_flag(env, "HF_HUB_OFFLINE");
  auto seconds = [&](const char* name, long fallback) {
    const auto text = env(name);
    if (!text) return fallback;
    try {
      size_t used = 0;
      const double s = std::stod(*text, &used);
      if (used == text->size() && s > 0 && s < 1e6) return std::max(1L, std::lround(s));
    } catch (const std::exception&) {
    }
    fail("{}={}: expected a number of seconds", name, *text);
  };
  o.connect_timeout_s = seconds("HF_HUB_ETAG_TIMEOUT", o.connect_timeout_s);
  o.stall_timeout_s = seconds("HF_HUB_DOWNLOAD_TIMEOUT", o.stall_timeout_s);
  return o;
}

std::string resolve_url(const std::string& endpoint, const std::string& repo,
                        const std::string& revision, const std::string& file) {
  return endpoint + "/" + repo + "/resolve/" + percent_encode(revision, false) + "/" +
         percent_encode(file, true);
}

std::vector<std::string> repo_files(const std::string& repo, const std::string& revision,
                                    const HubOptions& o) {
  RepoCache cache(o.cache_dir, repo);
  auto from_cache = [&](const std::string& why) {
    const auto commit = cache.commit_of(revision);
    if (!commit || cache.snapshot_files(*commit).empty())
      fail("{}: cannot list the repo's files ({}) and nothing of it is cached in {}", repo, why,
           o.cache_dir);
    return cache.snapshot_files(*commit);
  };
  if (o.offline) return from_cache("HF_HUB_OFFLINE is set");
  const std::string url =
      o.endpoint + "/api/models/" + repo + "/revision/" + percent_encode(revision, false);
  HttpResponse r;
  try {
    r = http_request("GET", url, http_options(o), 64 << 20);
  } catch (const NetworkError& e) {
    return from_cache(e.what());
  }
  if (r.status >= 500) return from_cache(fmt::format("HTTP {}", r.status));
  if (r.status >= 400) fail_http(repo, repo, "", r, o);
  std::vector<std::string> files;
  try {
    const auto info = nlohmann::json::parse(r.body);
    for (const auto& s : info.at("siblings")) files.push_back(s.at("rfilename").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the hub's file list ({}) is not what it should be: {}", repo, url, e.what());
  }
  return files;
}

namespace {

// `file` and, when it is a part of a split GGUF, every other part: the first part's Resolved
// (the loader finds the others beside it). The parts must lie side by side under their own names,
// as the first part's folder in one snapshot, or all in llama.cpp's flat cache.
Resolved resolve_with_parts(const std::string& asked, const std::string& repo,
                            const std::string& revision, const std::string& file,
                            const HubOptions& o) {
  const auto part = gguf::parse_split_name(file);
  if (!part || part->count == 1) return resolve_file(asked, repo, revision, file, o);
  auto resolve_all = [&](const HubOptions& with) {
    std::vector<Resolved> parts;
    for (uint64_t i = 0; i < part->count; ++i)
      parts.push_back(resolve_file(asked, repo, revision, part->path(i), with));
    return parts;
  };
  auto side_by_side = [&](const std::vector<Resolved>& parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      if (gguf::split_part_path(parts[0].path, i, parts.size()) != parts[i].path) return false;
    }
    return true;
  };
  std::vector<Resolved> parts = resolve_all(o);
  if (!side_by_side(parts) && !o.llama_cache_dir.empty()) {
    // Some parts in llama.cpp's cache and some in ours: take them all from ours.
    HubOptions ours = o;
    ours.llama_cache_dir.clear();
    parts = resolve_all(ours);
  }
  for (const auto& p : parts) {
    if (!p.commit.empty() && !parts[0].commit.empty() && p.commit != parts[0].commit)
      fail("{}: {} changed on the hub while its parts were fetched ({} at {}, {} at {}): run again",
           asked, repo, parts[0].file, parts[0].commit.substr(0, 12), p.file,
           p.commit.substr(0, 12));
  }
  if (!side_by_side(parts))
    fail("{}: the parts of {} are not side by side in the cache ({} and {})", asked, part->path(0),
         parts[0].path, parts[1].path);
  Resolved first = parts[0];
  for (const auto& p : parts) first.downloaded = first.downloaded || p.downloaded;
  return first;
}

}  // namespace

Resolved resolve(const ModelRef& ref, const HubOptions& o) {
  if (ref.is_path) return {.path = ref.path};
  std::string file = ref.file;
  if (file.empty())
    file = choose_quant_file(ref.repo, repo_files(ref.repo, ref.revision, o), ref.quant);
  try {
    return resolve_with_parts(ref.asked, ref.repo, ref.revision, file, o);
  } catch (const MissingFileError& e) {
    // An official name: its quant may be split into parts (x-Q8_0-00001-of-00003.gguf); else say
    // which quants the repo has.
    const std::string what = e.what();
    if (!ref.official) throw;
    std::vector<std::string> files;
    try {
      files = repo_files(ref.repo, ref.revision, o);
    } catch (const Error&) {
      throw MissingFileError(what);
    }
    // Trunk files by quant, a split counted once (by its first part).
    std::string have;
    bool split = false;
    for (const auto& f : files) {
      const auto part = gguf::parse_split_name(f);
      const std::string q = quant_of(f);
      if (file_role(f) != FileRole::kTrunk || q.empty() || (part && part->index != 0)) continue;
      have += (have.empty() ? "" : ", ") + q;
      split = split || (part && q == ref.quant);
    }
    if (split)
      return resolve_with_parts(ref.asked, ref.repo, ref.revision,
                                choose_quant_file(ref.repo, files, ref.quant), o);
    fail("{}; quants there: {}", what, have.empty() ? "none" : have);
  }
}

std::optional<Resolved> resolve_sidecar(const Resolved& trunk, SidecarKind kind,
                                        const HubOptions& o) {
  const std::string quant = quant_of(trunk.path);
  if (trunk.repo.empty()) {
    // A plain file: its folder's sidecars.
    std::vector<std::string> files;
    std::error_code ec;
    const fs::path dir = fs::path(trunk.path).parent_path();
    for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec))
      files.push_back(e.path().filename().string());
    auto file = choose_sidecar_file(trunk.path, files, kind, quant);
    if (!file) return std::nullopt;
    return Resolved{.path = (dir / *file).string()};
  }
  auto file =
      choose_sidecar_file(trunk.repo, repo_files(trunk.repo, trunk.revision, o), kind, quant);
  if (!file) return std::nullopt;
  return resolve_file(trunk.repo + ":" + *file, trunk.repo, trunk.revision, *file, o);
}

}  // namespace qwenrt::hub
