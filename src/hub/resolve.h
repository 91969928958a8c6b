// Resolution of a ModelRef to a local file: the path itself, or a repo file found in the Hugging
// Face cache or downloaded into it (huggingface_hub's rules: HEAD the resolve URL for the commit,
// ETag and size; reuse a blob already there; fall back to the cache when the hub is unreachable;
// never touch the network when offline).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hub/env.h"
#include "hub/http.h"
#include "hub/model_ref.h"

namespace qwenrt::hub {

// The hub answered that the repo has no such file (404 EntryNotFound).
class MissingFileError : public Error {
 public:
  using Error::Error;
};

struct HubOptions {
  std::string cache_dir;             // the Hugging Face cache (cache_dir(env))
  std::string llama_cache_dir;       // llama.cpp's flat cache, read only (llama_cpp_cache_dir(env))
  std::string endpoint;              // "https://huggingface.co", no trailing '/'
  std::optional<std::string> token;  // sent to the endpoint only
  bool offline = false;              // HF_HUB_OFFLINE: cache only, no request at all
  int retries = 3;                   // download attempts after the first, each resuming
  double retry_delay_s = 1.0;
  long connect_timeout_s = 10;  // HF_HUB_ETAG_TIMEOUT, as huggingface_hub's metadata timeout
  long stall_timeout_s = 30;    // HF_HUB_DOWNLOAD_TIMEOUT: a transfer moving no byte this long
  ProgressFn progress;          // download progress, or none
  std::function<void(const std::string&)> notice;  // one-line notes (downloading, fallbacks)
};

// From the environment: cache_dir(env), llama_cpp_cache_dir(env), QWENRT_HF_ENDPOINT then
// HF_ENDPOINT (default https://huggingface.co), access_token(env), HF_HUB_OFFLINE,
// HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT (seconds; a malformed value is an error naming it).
HubOptions hub_options(const Env& env);

struct Resolved {
  std::string path;      // the file to open
  std::string repo;      // empty for a plain path
  std::string revision;  // "main"
  std::string commit;
  std::string file;         // path inside the repo
  bool downloaded = false;  // whether bytes were fetched this time
};

// The file a ModelRef names (downloading it when it is not cached). Errors are one line naming
// what was asked and what happened.
Resolved resolve(const ModelRef& ref, const HubOptions& options);

// The files of a repo at a revision: the hub's model info when online, else the cached snapshot's.
std::vector<std::string> repo_files(const std::string& repo, const std::string& revision,
                                    const HubOptions& options);

// A trunk's drafter sidecar of `kind` (mtp-*.gguf / dflash-*.gguf), resolved like the trunk:
// from its repo (downloaded when needed), or beside a plain file. nullopt when there is none.
std::optional<Resolved> resolve_sidecar(const Resolved& trunk, SidecarKind kind,
                                        const HubOptions& options);

// "{endpoint}/{repo}/resolve/{revision}/{file}", revision and file percent-encoded.
std::string resolve_url(const std::string& endpoint, const std::string& repo,
                        const std::string& revision, const std::string& file);

}  // namespace qwenrt::hub
