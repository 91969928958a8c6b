#include "hub/http.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "hub/progress.h"

namespace qwenrt::hub {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

void global_init() {
  static const bool done = [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) fail("libcurl could not initialise");
    return true;
  }();
  (void)done;
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* s) const { curl_slist_free_all(s); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Headers of the last response only: a status line starts a new set (redirects, 100 Continue).
size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {
    headers->clear();
  } else if (auto colon = line.find(':'); colon != std::string::npos) {
    size_t v = colon + 1;
    while (v < line.size() && (line[v] == ' ' || line[v] == '\t')) ++v;
    (*headers)[lower(line.substr(0, colon))] = line.substr(v);
  }
  return size * n;
}

CurlHandle make_handle(const std::string& url, const HttpOptions& options, bool send_token,
                       Slist& headers) {
  global_init();
  CurlHandle curl(curl_easy_init());
  if (!curl) fail("libcurl could not make a handle");
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_USERAGENT, "qwenrt/0.1; hf_hub-compatible");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, options.connect_timeout_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options.low_speed_timeout_s);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_slist* list = nullptr;
  // Sizes and hashes refer to the stored bytes: no compression on the way.
  list = curl_slist_append(list, "Accept-Encoding: identity");
  if (send_token && options.token)
    list = curl_slist_append(list, ("Authorization: Bearer " + *options.token).c_str());
  headers.reset(list);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  return curl;
}

std::string curl_message(CURLcode code, const char* detail) {
  return detail != nullptr && *detail != '\0' ? std::string(detail) : curl_easy_strerror(code);
}

std::string hex(const unsigned char* bytes, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

// A running digest (OpenSSL's EVP interface: sha256 for LFS files, sha1 for git blobs).
class Digest {
 public:
  explicit Digest(const EVP_MD* md) : md_(md), ctx_(EVP_MD_CTX_new()) { reset(); }
  ~Digest() { EVP_MD_CTX_free(ctx_); }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void reset() {
    if (EVP_DigestInit_ex(ctx_, md_, nullptr) != 1) fail("OpenSSL: digest init failed");
  }
  void update(const void* data, size_t n) {
    if (EVP_DigestUpdate(ctx_, data, n) != 1) fail("OpenSSL: digest update failed");
  }
  std::string final_hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    if (EVP_DigestFinal_ex(ctx_, out, &n) != 1) fail("OpenSSL: digest final failed");
    return hex(out, n);
  }

 private:
  const EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

// Starts the digests over: sha256 of the bytes; git's blob sha1 of "blob <size>\0" + the bytes.
void start_digests(Digest& sha256, Digest* sha1, uint64_t size) {
  sha256.reset();
  if (sha1 == nullptr) return;
  sha1->reset();
  const std::string prefix = fmt::format("blob {}", size);
  sha1->update(prefix.c_str(), prefix.size() + 1);  // the header ends in a NUL byte
}

// What one download attempt writes through: the file, the digests, the progress.
struct Sink {
  CURL* curl = nullptr;
  FILE* file = nullptr;
  uint64_t offset = 0;   // bytes in the file when the attempt started
  uint64_t written = 0;  // bytes this attempt
  bool decided = false;  // whether the answer's status was looked at
  bool error_body = false;
  long status = 0;
  std::string body;  // of an error answer
  int write_errno = 0;
  Digest* sha256 = nullptr;
  Digest* sha1 = nullptr;
  uint64_t size = 0;  // of the whole file (the git blob header holds it)
  std::function<void(uint64_t)> on_bytes;
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t len = size * n;
  if (!sink->decided) {
    sink->decided = true;
    curl_easy_getinfo(sink->curl, CURLINFO_RESPONSE_CODE, &sink->status);
    if (sink->status >= 400) {
      sink->error_body = true;
    } else if (sink->status == 200 && sink->offset > 0) {
      // A whole answer to a Range request: start the file again.
      if (ftruncate(fileno(sink->file), 0) != 0 || std::fseek(sink->file, 0, SEEK_SET) != 0) {
        sink->write_errno = errno;
        return 0;
      }
      sink->offset = 0;
      start_digests(*sink->sha256, sink->sha1, sink->size);
    }
  }
  if (sink->error_body) {
    if (sink->body.size() < 4096) sink->body.append(data, std::min<size_t>(len, 4096));
    return len;
  }
  if (std::fwrite(data, 1, len, sink->file) != len) {
    sink->write_errno = errno != 0 ? errno : EIO;
    return 0;  // libcurl then ends the transfer with CURLE_WRITE_ERROR
  }
  sink->sha256->update(data, len);
  if (sink->sha1) sink->sha1->update(data, len);
  sink->written += len;
  if (sink->on_bytes) sink->on_bytes(sink->offset + sink->written);
  return len;
}

bool retryable(CURLcode code) {
  switch (code) {
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string HttpResponse::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

std::string url_origin(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return "";
  const std::string scheme = lower(url.substr(0, scheme_end));
  const size_t host_start = scheme_end + 3;
  size_t host_end = url.find_first_of("/?#", host_start);
  if (host_end == std::string::npos) host_end = url.size();
  std::string authority = lower(url.substr(host_start, host_end - host_start));
  if (auto at = authority.rfind('@'); at != std::string::npos) authority = authority.substr(at + 1);
  const size_t colon = authority.rfind(':');
  const bool has_port =
      colon != std::string::npos && authority.find(']', colon) == std::string::npos;
  if (!has_port) authority += scheme == "https" ? ":443" : ":80";
  return scheme + "://" + authority;
}

std::string resolve_location(const std::string& base, const std::string& location) {
  if (location.find("://") != std::string::npos) return location;
  const std::string origin_text = [&] {
    const size_t host_start = base.find("://") + 3;
    const size_t host_end = base.find_first_of("/?#", host_start);
    return base.substr(0, host_end);
  }();
  if (!location.empty() && location.front() == '/') return origin_text + location;
  // Relative to the base's folder.
  const size_t query = base.find_first_of("?#");
  const std::string path = base.substr(0, query);
  return path.substr(0, path.rfind('/') + 1) + location;
}

HttpResponse http_request(const std::string& method, const std::string& url,
                          const HttpOptions& options, size_t body_limit) {
  Slist headers(nullptr);
  CurlHandle curl = make_handle(url, options, true, headers);
  CURL* c = curl.get();
  HttpResponse response;
  response.url = url;
  if (method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &response.headers);
  struct Body {
    std::string* text;
    size_t limit;
  } body{&response.body, body_limit};
  curl_easy_setopt(
      c, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* user) {
        auto* b = static_cast<Body*>(user);
        const size_t len = size * n;
        if (b->text->size() < b->limit)
          b->text->append(data, std::min(len, b->limit - b->text->size()));
        return len;
      });
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
  char detail[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
  const CURLcode code = curl_easy_perform(c);
  if (code != CURLE_OK)
    throw NetworkError(fmt::format("{} {}: {}", method, url, curl_message(code, detail)));
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot open: {}", path, std::strerror(errno));
  Digest d(EVP_sha256());
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) d.update(buf.data(), n);
  std::fclose(f);
  return d.final_hex();
}

void download(const DownloadSpec& spec, const DownloadOptions& options) {
  const std::string& path = spec.incomplete_path;
  std::error_code ec;
  const uint64_t already = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
  // Room for the rest, before a byte is fetched.
  struct statvfs vfs;
  const std::string folder = fs::path(path).parent_path().string();
  if (statvfs(folder.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes + already < spec.size)
      fail("{}: not enough disk space: {} more needed, {} free in {}", spec.label,
           human_size(spec.size - std::min(already, spec.size)), human_size(free_bytes), folder);
  }

  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "ab+"), &std::fclose);
  if (!file) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
  // Unbuffered: a write error (a full disk) shows at the write that hit it, not at a later flush.
  std::setvbuf(file.get(), nullptr, _IONBF, 0);

  // What is already there counts: rehash it, so the final check covers every byte.
  Digest sha256(EVP_sha256());
  std::optional<Digest> sha1;
  if (!spec.git_sha1.empty()) sha1.emplace(EVP_sha1());
  start_digests(sha256, sha1 ? &*sha1 : nullptr, spec.size);
  uint64_t have = already;
  if (have > spec.size) {
    if (ftruncate(fileno(file.get()), 0) != 0) fail("{}: cannot truncate", path);
    have = 0;
  }
  if (have > 0) {
    std::vector<char> buf(1 << 20);
    std::fseek(file.get(), 0, SEEK_SET);
    for (uint64_t left = have; left > 0;) {
      const size_t n = std::fread(buf.data(), 1, std::min<uint64_t>(left, buf.size()), file.get());
      if (n == 0) fail("{}: cannot read back the partial download", path);
      sha256.update(buf.data(), n);
      if (sha1) sha1->update(buf.data(), n);
      left -= n;
    }
  }
  std::fseek(file.get(), 0, SEEK_END);

  const uint64_t resumed = have;
  const auto start = Clock::now();
  auto last_report = Clock::now() - std::chrono::seconds(1);
  bool drawn = false, ended = false;
  auto report = [&](uint64_t done, bool finished, bool failed = false) {
    if (!options.progress || ended || (failed && !drawn)) return;
    const auto now = Clock::now();
    if (!finished && !failed && now - last_report < std::chrono::milliseconds(100)) return;
    last_report = now;
    drawn = true;
    ended = finished || failed;
    options.progress({.label = spec.label,
                      .done = done,
                      .total = spec.size,
                      .resumed = resumed,
                      .seconds = std::chrono::duration<double>(now - start).count(),
                      .finished = finished,
                      .failed = failed});
  };
  // Whatever way this function is left early, a drawn progress line is ended before the error.
  struct EndProgress {
    std::function<void()> end;
    ~EndProgress() { end(); }
  } end_progress{[&] { report(have, false, true); }};

  std::string last_error;
  std::string url = spec.url;
  int relocations = 0;        // fresh links asked for since the last byte came
  uint64_t relocated_at = 0;  // `have` at the last one
  double delay = options.retry_delay_s;
  for (int attempt = 0; have < spec.size && attempt <= options.retries; ++attempt) {
    if (attempt > 0 && delay > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      delay *= 2;
    }
    Slist headers(nullptr);
    const bool send_token = url_origin(url) == options.token_origin;
    CurlHandle curl = make_handle(url, options.http, send_token, headers);
    CURL* c = curl.get();
    // Redirects to the CDN: libcurl drops our Authorization header when the host changes.
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    const std::string range = fmt::format("{}-", have);
    if (have > 0) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
    Sink sink{.curl = c,
              .file = file.get(),
              .offset = have,
              .sha256 = &sha256,
              .sha1 = sha1 ? &*sha1 : nullptr,
              .size = spec.size,
              .on_bytes = [&](uint64_t done) { report(done, false); }};
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    char detail[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
    const CURLcode code = curl_easy_perform(c);
    std::fflush(file.get());
    have = sink.offset + sink.written;
    if (sink.write_errno != 0) {
      fail("{}: cannot write {}: {}{}", spec.label, path, std::strerror(sink.write_errno),
           sink.write_errno == ENOSPC ? " (disk full)" : "");
    }
    long status = sink.status;
    if (!sink.decided) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (code != CURLE_OK && !retryable(code))
      throw NetworkError(fmt::format("{}: {}", spec.label, curl_message(code, detail)));
    if (status >= 400) {
      std::string body = sink.body.substr(0, sink.body.find('\n'));
      last_error = fmt::format("HTTP {} from {}{}{}", status, url, body.empty() ? "" : ": ",
                               body.substr(0, 200));
      if (have > relocated_at) relocations = 0;
      if ((status == 401 || status == 403 || status == 410) && spec.relocate && relocations < 3) {
        // An expired link: a new one from the hub, without spending an attempt.
        url = spec.relocate();
        ++relocations;
        relocated_at = have;
        --attempt;
        continue;
      }
      if (status == 416 && have > 0) {  // our range is past what the server holds: start again
        if (ftruncate(fileno(file.get()), 0) != 0) fail("{}: cannot truncate", path);
        std::fseek(file.get(), 0, SEEK_SET);
        have = 0;
        start_digests(sha256, sha1 ? &*sha1 : nullptr, spec.size);
        continue;
      }
      if (status < 500 && status != 429) fail("{}: {}", spec.label, last_error);
      continue;
    }
    if (code != CURLE_OK) last_error = curl_message(code, detail);
    if (have > spec.size) break;
  }
  if (have != spec.size) {
    if (have > spec.size) {
      file.reset();
      fs::remove(path, ec);
      fail("{}: the server sent {} bytes, the hub said {}: the download was removed", spec.label,
           have, spec.size);
    }
    fail("{}: download stopped at {} of {} bytes after {} attempts ({}); run again to resume",
         spec.label, have, spec.size, options.retries + 1,
         last_error.empty() ? "no more data" : last_error);
  }
  report(have, true);  // only a whole file ends the progress line
  file.reset();
  const std::string got = sha256.final_hex();
  if (!spec.sha256.empty() && got != spec.sha256) {
    fs::remove(path, ec);
    fail("{}: sha256 of the downloaded bytes is {}, the hub says {}: the download was removed",
         spec.label, got, spec.sha256);
  }
  if (sha1) {
    const std::string got1 = sha1->final_hex();
    if (got1 != spec.git_sha1) {
      fs::remove(path, ec);
      fail("{}: git sha1 of the downloaded bytes is {}, the hub says {}: the download was removed",
           spec.label, got1, spec.git_sha1);
    }
  }
}

}  // namespace qwenrt::hub
