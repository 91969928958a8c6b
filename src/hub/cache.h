// The Hugging Face cache as huggingface_hub lays it out, read and written by its rules:
//   <cache>/models--ORG--NAME/blobs/<etag>                 the bytes (etag: sha256 for LFS files)
//   <cache>/models--ORG--NAME/snapshots/<commit>/<file>    -> ../../blobs/<etag> (relative link)
//   <cache>/models--ORG--NAME/refs/<branch>                the commit, no trailing newline
//   <cache>/.locks/models--ORG--NAME/<etag>.lock           flock'ed while a blob is written
// A file huggingface_hub downloaded is found here, and one we downloaded is found by it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hub/env.h"

namespace qwenrt::hub {

// The cache folder, first of: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE (huggingface_hub's older name),
// HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
std::string cache_dir(const Env& env);

// The access token: HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), else the token file
// (HF_TOKEN_PATH, else HF_HOME/token, HF_HOME defaulting to XDG_CACHE_HOME/huggingface or
// ~/.cache/huggingface), surrounding whitespace stripped; nullopt when none is set.
std::optional<std::string> access_token(const Env& env);

// Error unless `repo` is ORG/NAME as the hub allows it (letters, digits, '-', '_', '.'; no "--" or
// ".."; at most 96 characters): repo ids become folder names, so nothing else may pass.
void check_repo_id(const std::string& repo);
// Error unless `file` is a relative path inside a repo (no "..", no leading '/', no '\\').
void check_repo_file(const std::string& file);

// llama.cpp's own download folder (its `-hf` before it used this cache): LLAMA_CACHE, else
// XDG_CACHE_HOME/llama.cpp, else ~/.cache/llama.cpp; empty when none can be named.
std::string llama_cpp_cache_dir(const Env& env);
// The file llama.cpp keeps for (repo, file) there, flat: "ORG_NAME_FILE" with every '/' as '_'.
std::string llama_cpp_cache_path(const std::string& dir, const std::string& repo,
                                 const std::string& file);

// "models--ORG--NAME".
std::string repo_folder(const std::string& repo);

class RepoCache {
 public:
  RepoCache(std::string cache_dir, std::string repo);

  const std::string& repo() const { return repo_; }
  std::string dir() const;
  std::string blob_path(const std::string& etag) const;
  std::string incomplete_path(const std::string& etag) const;
  std::string lock_path(const std::string& etag) const;
  std::string snapshot_path(const std::string& commit, const std::string& file) const;

  // The commit `revision` names: the content of refs/<revision> with surrounding whitespace
  // stripped (a hand-written ref may end in a newline), the revision itself when it is a 40-hex
  // commit, nullopt when the cache knows neither.
  std::optional<std::string> commit_of(const std::string& revision) const;
  // The cached file for (revision, file) if it exists (a link to an existing blob).
  std::optional<std::string> cached_file(const std::string& revision,
                                         const std::string& file) const;
  // Files (relative paths) under snapshots/<commit>, sorted.
  std::vector<std::string> snapshot_files(const std::string& commit) const;

  // refs/<revision> = commit, written whole (no newline, as huggingface_hub writes it and
  // reads it back unstripped); nothing when revision is the commit itself.
  void write_ref(const std::string& revision, const std::string& commit) const;
  // snapshots/<commit>/<file> -> ../../blobs/<etag>, replacing whatever was there.
  void link_snapshot(const std::string& commit, const std::string& file,
                     const std::string& etag) const;

 private:
  std::string root_;
  std::string repo_;
};

// One GGUF file in the cache, for `qwenrt ls`.
struct CachedFile {
  std::string repo;
  std::string file;               // path inside the repo
  std::string commit;             // the snapshot holding it
  std::vector<std::string> refs;  // branches pointing at that snapshot ("main")
  std::string path;               // the snapshot path
  uint64_t size = 0;              // the blob's size (of a split GGUF: its cached parts' sum)
  int parts = 1;                  // a split GGUF's parts (file, path: the first's)
  int parts_cached = 1;           // of those, in the snapshot
};

struct CacheListing {
  std::vector<CachedFile> files;  // sorted by repo, file, commit
  uint64_t partial_bytes = 0;     // in blobs/*.incomplete (downloads that can resume)
  int partial_count = 0;
};

// Every .gguf in every model repo of the cache (mmproj, mtp and dflash files included); the parts
// of a split GGUF in one snapshot are one entry, named by its first part.
CacheListing list_cache(const std::string& cache_dir);

bool is_commit_hash(const std::string& text);

}  // namespace qwenrt::hub
