// HTTP over libcurl, as the hub client needs it: one request with the hub's headers, and a
// resumable, verified download of one file into a `.incomplete` path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "core/error.h"

namespace qwenrt::hub {

// No HTTP answer at all (connection refused, name not resolved, timeout, TLS failure): the caller
// may fall back to the cache. An HTTP error status is an answer, not a NetworkError.
class NetworkError : public Error {
 public:
  using Error::Error;
};

struct HttpOptions {
  std::optional<std::string> token;  // sent as "Authorization: Bearer ..." when set
  long connect_timeout_s = 10;
  long low_speed_timeout_s = 30;  // abort a transfer that moves no byte for this long
};

struct HttpResponse {
  long status = 0;
  std::string url;                             // the URL that gave this answer
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // at most body_limit bytes kept

  std::string header(const std::string& lower_name) const;
};

// One request, redirects not followed (the caller decides which to follow).
HttpResponse http_request(const std::string& method, const std::string& url,
                          const HttpOptions& options, size_t body_limit = 1 << 20);

// scheme://host:port of a URL (port made explicit), for "same origin" decisions.
std::string url_origin(const std::string& url);
// `location` resolved against `base` (absolute, or a path on base's origin).
std::string resolve_location(const std::string& base, const std::string& location);

struct Progress {
  std::string label;      // what is being downloaded
  uint64_t done = 0;      // bytes in the file so far (resumed bytes included)
  uint64_t total = 0;     // bytes expected
  uint64_t resumed = 0;   // bytes that were already there when this run started
  double seconds = 0;     // since this run started
  bool finished = false;  // the whole file is there
  bool failed = false;    // the download stopped early (an error follows)
};
using ProgressFn = std::function<void(const Progress&)>;

struct DownloadSpec {
  std::string url;              // where the bytes are (redirects followed)
  std::string incomplete_path;  // appended to; resumed from its current size
  uint64_t size = 0;            // bytes expected
  std::string sha256;           // expected lower-case hex, or empty
  std::string git_sha1;         // expected git blob sha1 (non-LFS files), or empty
  std::string label;            // for messages
  // A fresh `url` when the server refuses the one in hand (401 / 403 / 410: a signed CDN link
  // that expired during a long download): the hub is asked again and the download resumes there.
  std::function<std::string()> relocate;
};

struct DownloadOptions {
  HttpOptions http;  // the token is sent only while on `token_origin`
  std::string token_origin;
  int retries = 3;             // further attempts after a cut connection or a 5xx, each resuming
  double retry_delay_s = 1.0;  // doubled each attempt
  ProgressFn progress;
};

// Brings incomplete_path to `size` bytes with Range requests, then checks size and hash. A hash
// mismatch removes the file and fails; a failure before the end keeps it for the next run.
void download(const DownloadSpec& spec, const DownloadOptions& options);

// Lower-case hex sha256 of a whole file (tests and checks).
std::string sha256_file(const std::string& path);

}  // namespace qwenrt::hub
