// Model resolution (src/hub) against a fake hub on 127.0.0.1 (tests/python/fake_hub.py): names and
// repos, the Hugging Face cache layout and its environment, downloads with redirects, resume and
// verification, offline mode, and the errors a person sees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "gguf/reader.h"
#include "gguf/split.h"
#include "hub/cache.h"
#include "hub/model_ref.h"
#include "hub/progress.h"
#include "hub/resolve.h"
#include "model/identity.h"
#include "support/fake_hub.h"
#include "support/hub_env.h"
#include "support/model_files.h"
#include "support/run_binary.h"

namespace qwenrt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_support::env_of;
using testing_support::FakeHub;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kCommit2 = "fedcba9876543210fedcba9876543210fedcba98";
const std::string kTinyModel =
    std::string(QWENRT_SOURCE_DIR) + "/models/qwen35-chat-tiny.Q8_0.gguf";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The tiny trained model renamed as an official checkpoint (general.name), 6 MB.
const std::string& official_file() {
  static const std::string path = [] {
    const std::string out = testing_support::temp_path("Qwen3.6-27B-as-served.gguf");
    testing_support::rewrite(kTinyModel, out, [](auto& kv, auto&, auto&) {
      for (auto& [key, value] : kv) {
        if (key == "general.name") value = gguf::Value::str("Qwen3.6-27B");
      }
    });
    return out;
  }();
  return path;
}

json lfs(const std::string& path) {
  return {{"path", path}, {"lfs", true}};
}

// The tiny trained model as a split GGUF of three parts (gguf/split.h).
const std::vector<std::string>& split_parts() {
  static const std::vector<std::string> parts = [] {
    const std::string dir = testing_support::temp_path("split-parts");
    fs::create_directories(dir);
    const gguf::File src = gguf::File::open(kTinyModel).value();
    return gguf::write_split(src, dir + "/tiny",
                             {.max_part_tensors = (src.tensors().size() + 2) / 3});
  }();
  return parts;
}

// One official repo and one community repo with several quants, a projector and a drafter.
json hub_config() {
  return {{"token", "hf_secret"},
          {"repos",
           {{"ggml-org/Qwen3.6-27B-GGUF",
             {{"commit", kCommit},
              {"files",
               {{"Qwen3.6-27B-Q4_K_M.gguf", lfs(official_file())},
                {"Qwen3.6-27B-Q8_0.gguf", lfs(kTinyModel)},
                {"Qwen3.6-27B-Q6_K-00001-of-00003.gguf", lfs(split_parts()[0])},
                {"Qwen3.6-27B-Q6_K-00002-of-00003.gguf", lfs(split_parts()[1])},
                {"Qwen3.6-27B-Q6_K-00003-of-00003.gguf", lfs(split_parts()[2])},
                {"README.md", {{"text", "# Qwen3.6-27B GGUF\n"}}}}}}},
            {"someone/Tiny-GGUF",
             {{"commit", kCommit2},
              {"files",
               {{"Tiny-Q8_0.gguf", lfs(kTinyModel)},
                {"Tiny-UD-Q8_0.gguf", lfs(kTinyModel)},
                {"Tiny-Q4_K_M-00001-of-00002.gguf", lfs(kTinyModel)},
                {"mmproj-Tiny-F16.gguf", lfs(kTinyModel)},
                {"mtp-Tiny-Q8_0.gguf", lfs(official_file())},
                {"plain.gguf", {{"path", kTinyModel}}}}}}},
            {"someone/Private-GGUF",
             {{"commit", kCommit2}, {"private", true}, {"files", {{"p.gguf", lfs(kTinyModel)}}}}},
            {"someone/Gated-GGUF",
             {{"commit", kCommit2}, {"gated", true}, {"files", {{"g.gguf", lfs(kTinyModel)}}}}},
            {"someone/Broken-GGUF",
             {{"commit", kCommit2}, {"status", 500}, {"files", {{"b.gguf", lfs(kTinyModel)}}}}}}}};
}

class HubTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { hub_ = new FakeHub(hub_config()); }
  static void TearDownTestSuite() {
    delete hub_;
    hub_ = nullptr;
  }
  void SetUp() override {
    static int n = 0;
    cache_ = testing_support::temp_path("hf-cache-" + std::to_string(n++));
    fs::remove_all(cache_);
    hub_->set_config(hub_config());
    hub_->clear_log();
  }

  hub::HubOptions options() const {
    hub::HubOptions o;
    o.cache_dir = cache_;
    o.endpoint = hub_->endpoint();
    o.retries = 0;
    o.retry_delay_s = 0;
    o.connect_timeout_s = 5;
    return o;
  }
  hub::Resolved resolve(const std::string& text, const hub::HubOptions& o) const {
    return hub::resolve(hub::parse_model_ref(text, true), o);
  }
  std::vector<json> requests(const std::string& server, const std::string& method = "") const {
    std::vector<json> out;
    for (const auto& r : hub_->requests()) {
      if (r["server"] == server && (method.empty() || r["method"] == method)) out.push_back(r);
    }
    return out;
  }
  std::string repo_dir(const std::string& repo) const {
    return cache_ + "/models--" + repo.substr(0, repo.find('/')) + "--" +
           repo.substr(repo.find('/') + 1);
  }
  std::string sha256_of(const std::string& path) const {
    // Independent of our digest code: the system's sha256sum.
    FILE* p = popen(("sha256sum '" + path + "'").c_str(), "r");
    char buf[256] = {0};
    const size_t n = fread(buf, 1, sizeof buf - 1, p);
    pclose(p);
    return std::string(buf, n).substr(0, 64);
  }

  static FakeHub* hub_;
  std::string cache_;
};
FakeHub* HubTest::hub_ = nullptr;

// ---- the cache by hand: what huggingface_hub leaves, read by its rules --------------------

TEST_F(HubTest, RefWithTrailingNewlineIsStrippedAndNotDownloadedAgain) {
  const std::string dir = repo_dir("ggml-org/Qwen3.6-27B-GGUF");
  const std::string etag = sha256_of(official_file());
  fs::create_directories(dir + "/blobs");
  fs::create_directories(dir + "/snapshots/" + kCommit);
  fs::create_directories(dir + "/refs");
  fs::copy_file(official_file(), dir + "/blobs/" + etag);
  fs::create_symlink("../../blobs/" + etag,
                     dir + "/snapshots/" + kCommit + "/Qwen3.6-27B-Q4_K_M.gguf");
  std::ofstream(dir + "/refs/main") << kCommit << "\n";

  auto o = options();
  o.offline = true;
  const auto offline = resolve("Qwen3.6-27B", o);
  EXPECT_EQ(offline.path, dir + "/snapshots/" + kCommit + "/Qwen3.6-27B-Q4_K_M.gguf");
  EXPECT_EQ(offline.commit, kCommit);
  EXPECT_TRUE(hub_->requests().empty());

  const auto online = resolve("Qwen3.6-27B", options());
  EXPECT_EQ(online.path, offline.path);
  EXPECT_FALSE(online.downloaded);
  EXPECT_EQ(requests("hub", "HEAD").size(), 1u);
  EXPECT_TRUE(requests("hub", "GET").empty());
  EXPECT_TRUE(requests("cdn").empty());
}

TEST_F(HubTest, OfflineWithNothingCachedTouchesNoNetwork) {
  auto o = options();
  o.offline = true;
  try {
    resolve("Qwen3.6-27B:Q8_0", o);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Qwen3.6-27B:Q8_0"), std::string::npos) << m;
    EXPECT_NE(m.find("HF_HUB_OFFLINE"), std::string::npos) << m;
    EXPECT_NE(m.find(cache_), std::string::npos) << m;
  }
  EXPECT_THROW(resolve("someone/Tiny-GGUF:Q8_0", o), Error);  // listing from the cache only
  EXPECT_TRUE(hub_->requests().empty());
}

// ---- downloads ------------------------------------------------------------------------------

TEST_F(HubTest, DownloadsIntoTheHuggingFaceLayout) {
  const auto r = resolve("Qwen3.6-27B", options());
  EXPECT_TRUE(r.downloaded);
  EXPECT_EQ(r.commit, kCommit);
  const std::string dir = repo_dir("ggml-org/Qwen3.6-27B-GGUF");
  const std::string etag = sha256_of(official_file());
  EXPECT_EQ(r.path, dir + "/snapshots/" + kCommit + "/Qwen3.6-27B-Q4_K_M.gguf");
  ASSERT_TRUE(fs::is_symlink(r.path));
  EXPECT_EQ(fs::read_symlink(r.path).string(), "../../blobs/" + etag);
  EXPECT_EQ(read_all(dir + "/blobs/" + etag), read_all(official_file()));
  EXPECT_EQ(read_all(dir + "/refs/main"), kCommit);  // no newline, as huggingface_hub writes it
  EXPECT_FALSE(fs::exists(dir + "/blobs/" + etag + ".incomplete"));
  // The file opens and identifies as what it was asked for.
  const auto file = gguf::File::open(r.path).value();
  EXPECT_EQ(model::identify(file).checkpoint, model::Checkpoint::kQwen36_27B);
  // The hub redirected; the CDN served the bytes, without our token.
  EXPECT_EQ(requests("cdn", "GET").size(), 1u);

  hub_->clear_log();
  const auto again = resolve("Qwen3.6-27B:Q4_K_M", options());
  EXPECT_FALSE(again.downloaded);
  EXPECT_EQ(again.path, r.path);
  EXPECT_TRUE(requests("cdn").empty());
}

TEST_F(HubTest, SameBlobInAnotherFileIsLinkedNotFetched) {
  resolve("Qwen3.6-27B:Q8_0", options());
  hub_->clear_log();
  const auto r = resolve("someone/Tiny-GGUF:Q8_0", options());  // the same bytes, another repo
  EXPECT_TRUE(r.downloaded);                                    // another repo folder: its own blob
  EXPECT_EQ(r.file, "Tiny-Q8_0.gguf");
  hub_->clear_log();
  const auto ud = resolve("someone/Tiny-GGUF:Tiny-UD-Q8_0.gguf", options());
  EXPECT_FALSE(ud.downloaded);  // same etag in the same repo: linked to the blob already there
  EXPECT_TRUE(requests("cdn").empty());
  EXPECT_EQ(fs::read_symlink(ud.path), fs::read_symlink(r.path));
}

TEST_F(HubTest, TwoDownloadsOfOneFileFetchItOnce) {
  // The blob's lock: the second waits, then finds the blob in place.
  hub::Resolved a, b;
  std::thread first([&] { a = resolve("Qwen3.6-27B:Q8_0", options()); });
  std::thread second([&] { b = resolve("Qwen3.6-27B:Q8_0", options()); });
  first.join();
  second.join();
  EXPECT_EQ(a.path, b.path);
  EXPECT_NE(a.downloaded, b.downloaded);
  EXPECT_EQ(read_all(a.path), read_all(kTinyModel));
  EXPECT_EQ(requests("cdn", "GET").size(), 1u);
}

TEST_F(HubTest, TokenGoesToTheHubNotToTheCdn) {
  auto o = options();
  EXPECT_THROW(resolve("someone/Private-GGUF:p.gguf", o), Error);
  o.token = "hf_secret";
  hub_->clear_log();
  const auto r = resolve("someone/Private-GGUF:p.gguf", o);
  EXPECT_EQ(read_all(r.path), read_all(kTinyModel));
  const auto head = requests("hub", "HEAD");
  ASSERT_EQ(head.size(), 1u);
  EXPECT_EQ(head[0]["authorization"], "Bearer hf_secret");
  const auto cdn = requests("cdn", "GET");
  ASSERT_EQ(cdn.size(), 1u);
  EXPECT_TRUE(cdn[0]["authorization"].is_null()) << cdn[0].dump();
}

TEST_F(HubTest, ResumesAfterACutConnection) {
  auto config = hub_config();
  config["cut_after"] = 1 << 20;
  config["cut_count"] = 1;
  hub_->set_config(config);
  const std::string etag = sha256_of(kTinyModel);
  const std::string blobs = repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/blobs/";
  std::vector<hub::Progress> events;
  auto o = options();
  o.progress = [&](const hub::Progress& p) { events.push_back(p); };
  try {
    resolve("Qwen3.6-27B:Q8_0", o);
    FAIL() << "a cut connection without retries must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run again to resume"), std::string::npos) << e.what();
  }
  // Nothing that looks complete: a partial blob, no blob, no snapshot file.
  EXPECT_EQ(fs::file_size(blobs + etag + ".incomplete"), 1u << 20);
  const auto listing = hub::list_cache(cache_);
  EXPECT_TRUE(listing.files.empty());
  EXPECT_EQ(listing.partial_count, 1);
  EXPECT_EQ(listing.partial_bytes, 1u << 20);
  // The progress line was ended as failed, never as finished.
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().failed);
  EXPECT_EQ(events.back().done, 1u << 20);
  EXPECT_TRUE(std::none_of(events.begin(), events.end(), [](auto& p) { return p.finished; }));
  EXPECT_FALSE(fs::exists(blobs + etag));
  EXPECT_FALSE(fs::exists(repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/snapshots/" + kCommit +
                          "/Qwen3.6-27B-Q8_0.gguf"));

  hub_->clear_log();
  events.clear();
  const auto r = resolve("Qwen3.6-27B:Q8_0", o);
  EXPECT_TRUE(r.downloaded);
  EXPECT_EQ(read_all(r.path), read_all(kTinyModel));
  const auto cdn = requests("cdn", "GET");
  ASSERT_EQ(cdn.size(), 1u);
  EXPECT_EQ(cdn[0]["range"], "bytes=1048576-");
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().finished);
  EXPECT_EQ(events.back().resumed, 1u << 20);
  EXPECT_EQ(events.back().done, fs::file_size(kTinyModel));
  EXPECT_FALSE(fs::exists(blobs + etag + ".incomplete"));
}

TEST_F(HubTest, RetriesACutConnectionWithinOneRun) {
  auto config = hub_config();
  config["cut_after"] = 300000;
  config["cut_count"] = 2;
  hub_->set_config(config);
  auto o = options();
  o.retries = 2;
  const auto r = resolve("Qwen3.6-27B:Q8_0", o);
  EXPECT_EQ(read_all(r.path), read_all(kTinyModel));
  const auto cdn = requests("cdn", "GET");
  ASSERT_EQ(cdn.size(), 3u);
  EXPECT_TRUE(cdn[0]["range"].is_null());
  // Each retry resumes where the bytes that arrived end: 300000 a cut when the server's close is
  // seen after all it sent (the usual case), less when a reset drops some of them in flight.
  auto start_of = [](const json& range) {
    const std::string r = range.is_string() ? range.get<std::string>() : "";
    EXPECT_EQ(r.rfind("bytes=", 0), 0u) << r;
    EXPECT_TRUE(!r.empty() && r.back() == '-') << r;
    return r.size() > 7 ? std::stoll(r.substr(6, r.size() - 7)) : -1;
  };
  const int64_t first = start_of(cdn[1]["range"]), second = start_of(cdn[2]["range"]);
  EXPECT_GT(first, 0);
  EXPECT_LE(first, 300000);
  EXPECT_GT(second, first);
  EXPECT_LE(second, first + 300000);
}

TEST_F(HubTest, AnExpiredCdnLinkIsAskedForAgainAndTheDownloadResumes) {
  // Each signed link serves one request: after a cut, the retry's link has expired (403).
  auto config = hub_config();
  config["cut_after"] = 300000;
  config["cut_count"] = 1;
  config["expire_links"] = true;
  hub_->set_config(config);
  auto o = options();
  o.retries = 1;
  std::vector<std::string> notes;
  o.notice = [&](const std::string& n) { notes.push_back(n); };
  const auto r = resolve("Qwen3.6-27B:Q8_0", o);
  EXPECT_EQ(read_all(r.path), read_all(kTinyModel));
  const auto cdn = requests("cdn", "GET");
  ASSERT_EQ(cdn.size(), 3u);  // cut, expired, resumed on the new link
  EXPECT_EQ(cdn[0]["path"], cdn[1]["path"]);
  EXPECT_NE(cdn[2]["path"], cdn[1]["path"]);
  EXPECT_TRUE(cdn[2]["range"].is_string());
  const auto heads = requests("hub", "HEAD");
  EXPECT_EQ(heads.size(), 2u);
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("link expired") != std::string::npos;
  }));
  // Without a hub to ask, an expired link is an error naming the answer.
  fs::remove_all(cache_);
  config["cut_count"] = 0;
  config["expire_links"] = true;
  hub_->set_config(config);
  const std::string incomplete = testing_support::temp_path("expired.incomplete");
  fs::remove(incomplete);
  hub::DownloadSpec spec{.url = "http://127.0.0.1:" + std::to_string(hub_->cdn_port()) +
                                cdn[0]["path"].get<std::string>(),
                         .incomplete_path = incomplete,
                         .size = fs::file_size(kTinyModel),
                         .label = "expired"};
  try {
    hub::download(spec, {.retries = 0, .retry_delay_s = 0});
    FAIL() << "a used link must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTTP 403"), std::string::npos) << e.what();
  }
}

TEST_F(HubTest, AServerIgnoringRangeStartsTheFileAgain) {
  auto config = hub_config();
  config["ignore_range"] = true;
  hub_->set_config(config);
  const std::string blobs = repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/blobs/";
  fs::create_directories(blobs);
  std::ofstream(blobs + sha256_of(kTinyModel) + ".incomplete") << std::string(5000, 'x');
  const auto r = resolve("Qwen3.6-27B:Q8_0", options());
  EXPECT_EQ(read_all(r.path), read_all(kTinyModel));
  EXPECT_EQ(requests("cdn", "GET").at(0)["range"], "bytes=5000-");
}

TEST_F(HubTest, CorruptDownloadIsRejectedAndRemoved) {
  auto config = hub_config();
  config["corrupt"] = true;
  hub_->set_config(config);
  const std::string dir = repo_dir("ggml-org/Qwen3.6-27B-GGUF");
  const std::string etag = sha256_of(kTinyModel);
  try {
    resolve("Qwen3.6-27B:Q8_0", options());
    FAIL() << "a corrupt download must fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sha256"), std::string::npos) << m;
    EXPECT_NE(m.find(etag), std::string::npos) << m;
    EXPECT_NE(m.find("Qwen3.6-27B:Q8_0"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir + "/blobs/" + etag));
  EXPECT_FALSE(fs::exists(dir + "/blobs/" + etag + ".incomplete"));
  EXPECT_FALSE(fs::exists(dir + "/snapshots/" + kCommit + "/Qwen3.6-27B-Q8_0.gguf"));
}

TEST_F(HubTest, NonLfsFileIsCheckedByItsGitSha1) {
  const auto r = resolve("someone/Tiny-GGUF:plain.gguf", options());
  EXPECT_EQ(read_all(r.path), read_all(kTinyModel));
  EXPECT_TRUE(requests("cdn").empty());  // served by the hub itself
  // Its etag is git's blob sha1 (40 hex), which names the blob.
  const std::string target = fs::read_symlink(r.path).filename().string();
  EXPECT_EQ(target.size(), 40u);
}

TEST_F(HubTest, QuantPicksTheFileAndSidecarsResolveTheSameWay) {
  const auto r = resolve("someone/Tiny-GGUF:Q8_0", options());
  EXPECT_EQ(r.file, "Tiny-Q8_0.gguf");  // not the UD variant, not mmproj, not mtp
  const auto mtp = hub::resolve_sidecar(r, hub::SidecarKind::kMtp, options());
  ASSERT_TRUE(mtp.has_value());
  EXPECT_EQ(mtp->file, "mtp-Tiny-Q8_0.gguf");
  EXPECT_EQ(read_all(mtp->path), read_all(official_file()));
  EXPECT_EQ(hub::resolve_sidecar(r, hub::SidecarKind::kDflash, options()), std::nullopt);
  // Offline, the listing comes from the cached snapshot.
  auto o = options();
  o.offline = true;
  hub_->clear_log();
  EXPECT_EQ(resolve("someone/Tiny-GGUF:Q8_0", o).path, r.path);
  EXPECT_TRUE(hub_->requests().empty());
  // A split quant of which the repo has only some parts is refused by name.
  try {
    resolve("someone/Tiny-GGUF:Q4_K_M", options());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split into 2 parts, but the repo has no "
                                         "Tiny-Q4_K_M-00002-of-00002.gguf"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(HubTest, SplitQuantDownloadsEveryPartAndOpensAsOneModel) {
  // The official name's single file is not there: the listing has it in three parts.
  const auto r = resolve("Qwen3.6-27B:Q6_K", options());
  EXPECT_EQ(r.file, "Qwen3.6-27B-Q6_K-00001-of-00003.gguf");
  EXPECT_TRUE(r.downloaded);
  EXPECT_EQ(requests("cdn", "GET").size(), 3u);
  const std::string snapshot = repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/snapshots/" + kCommit;
  EXPECT_EQ(r.path, snapshot + "/Qwen3.6-27B-Q6_K-00001-of-00003.gguf");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(read_all(snapshot + fmt::format("/Qwen3.6-27B-Q6_K-0000{}-of-00003.gguf", i + 1)),
              read_all(split_parts()[i]));
  }
  const gguf::File split = gguf::File::open(r.path).value();
  const gguf::File whole = gguf::File::open(kTinyModel).value();
  EXPECT_EQ(split.parts().size(), 3u);
  ASSERT_EQ(split.tensors().size(), whole.tensors().size());
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const auto& a = whole.tensors()[i];
    const auto& b = split.tensors()[i];
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
  }
  // Named by a later part, a repo's split resolves to its first part; offline, from the cache.
  auto o = options();
  o.offline = true;
  hub_->clear_log();
  EXPECT_EQ(resolve("ggml-org/Qwen3.6-27B-GGUF:Qwen3.6-27B-Q6_K-00002-of-00003.gguf", o).path,
            r.path);
  EXPECT_EQ(resolve("ggml-org/Qwen3.6-27B-GGUF:Q6_K", o).path, r.path);
  EXPECT_TRUE(hub_->requests().empty());
  // ls: one entry for the three parts, their sizes summed.
  const auto listing = hub::list_cache(cache_);
  const auto it = std::find_if(listing.files.begin(), listing.files.end(), [](const auto& f) {
    return f.file.find("Q6_K") != std::string::npos;
  });
  ASSERT_NE(it, listing.files.end());
  EXPECT_EQ(it->file, "Qwen3.6-27B-Q6_K-00001-of-00003.gguf");
  EXPECT_EQ(it->parts, 3);
  EXPECT_EQ(it->parts_cached, 3);
  EXPECT_EQ(it->size, fs::file_size(split_parts()[0]) + fs::file_size(split_parts()[1]) +
                          fs::file_size(split_parts()[2]));
  EXPECT_EQ(std::count_if(listing.files.begin(), listing.files.end(),
                          [](const auto& f) { return f.file.find("Q6_K") != std::string::npos; }),
            1);
}

TEST_F(HubTest, SplitPartsComeFromOneCacheNeverHalfFromLlamaCpps) {
  const std::string llama = testing_support::temp_path("llama-cache-split");
  fs::remove_all(llama);
  fs::create_directories(llama);
  auto flat = [&](int i) {
    return llama +
           fmt::format("/ggml-org_Qwen3.6-27B-GGUF_Qwen3.6-27B-Q6_K-0000{}-of-00003.gguf", i + 1);
  };
  // Two of three parts in llama.cpp's flat cache: all three come into ours.
  fs::copy_file(split_parts()[0], flat(0));
  fs::copy_file(split_parts()[1], flat(1));
  auto o = options();
  o.llama_cache_dir = llama;
  auto r = resolve("Qwen3.6-27B:Q6_K", o);
  EXPECT_EQ(r.path, repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/snapshots/" + kCommit +
                        "/Qwen3.6-27B-Q6_K-00001-of-00003.gguf");
  EXPECT_EQ(gguf::File::open(r.path).value().parts().size(), 3u);
  // All three there: used where they are, nothing fetched.
  fs::remove_all(cache_);
  fs::copy_file(split_parts()[2], flat(2));
  hub_->clear_log();
  r = resolve("Qwen3.6-27B:Q6_K", o);
  EXPECT_EQ(r.path, flat(0));
  EXPECT_TRUE(requests("cdn").empty());
  EXPECT_EQ(gguf::File::open(r.path).value().parts().size(), 3u);
}

TEST_F(HubTest, UsesWhatLlamaCppDownloadedWhenItMatchesTheHub) {
  const std::string llama = testing_support::temp_path("llama-cache");
  fs::create_directories(llama);
  const std::string flat = llama + "/ggml-org_Qwen3.6-27B-GGUF_Qwen3.6-27B-Q8_0.gguf";
  fs::copy_file(kTinyModel, flat, fs::copy_options::overwrite_existing);
  auto o = options();
  o.llama_cache_dir = llama;
  auto r = resolve("Qwen3.6-27B:Q8_0", o);
  EXPECT_EQ(r.path, flat);
  EXPECT_FALSE(r.downloaded);
  EXPECT_EQ(r.commit, kCommit);
  EXPECT_TRUE(requests("cdn").empty());
  o.offline = true;
  EXPECT_EQ(resolve("Qwen3.6-27B:Q8_0", o).path, flat);
  // An ETag noted beside it that disagrees with the hub's: not the same file, download it.
  std::ofstream(flat + ".etag") << "\"0000\"\n";
  o.offline = false;
  r = resolve("Qwen3.6-27B:Q8_0", o);
  EXPECT_TRUE(r.downloaded);
  EXPECT_NE(r.path, flat);
  EXPECT_EQ(hub::llama_cpp_cache_dir(env_of({{"HOME", "/h"}})), "/h/.cache/llama.cpp");
  EXPECT_EQ(hub::llama_cpp_cache_dir(env_of({{"HOME", "/h"}, {"LLAMA_CACHE", "/l"}})), "/l");
}

// ---- errors ---------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(HubTest, HubErrorsNameWhatWasAskedAndWhatHappened) {
  const auto o = options();
  std::string m = error_of([&] { resolve("nobody/Nothing-GGUF:x.gguf", o); });
  EXPECT_NE(m.find("nobody/Nothing-GGUF"), std::string::npos) << m;
  EXPECT_NE(m.find("not found"), std::string::npos) << m;
  m = error_of([&] { resolve("Qwen3.6-27B:Q2_K", o); });
  EXPECT_NE(m.find("has no file Qwen3.6-27B-Q2_K.gguf"), std::string::npos) << m;
  EXPECT_NE(m.find("quants there: Q4_K_M, Q6_K, Q8_0"), std::string::npos) << m;
  m = error_of([&] { resolve("someone/Private-GGUF:p.gguf", o); });
  EXPECT_NE(m.find("HTTP 401"), std::string::npos) << m;
  EXPECT_NE(m.find("HF_TOKEN"), std::string::npos) << m;
  auto wrong = o;
  wrong.token = "hf_wrong";
  m = error_of([&] { resolve("someone/Private-GGUF:p.gguf", wrong); });
  EXPECT_NE(m.find("the token sent has no access"), std::string::npos) << m;
  m = error_of([&] { resolve("someone/Gated-GGUF:g.gguf", o); });
  EXPECT_NE(m.find("gated"), std::string::npos) << m;
  EXPECT_NE(m.find("HTTP 403"), std::string::npos) << m;
  m = error_of([&] { resolve("someone/Broken-GGUF:b.gguf", o); });
  EXPECT_NE(m.find("HTTP 500"), std::string::npos) << m;
  EXPECT_NE(m.find("someone/Broken-GGUF:b.gguf"), std::string::npos) << m;
  m = error_of([&] { resolve("someone/Broken-GGUF:Q8_0", o); });  // the listing fails
  EXPECT_NE(m.find("HTTP 500"), std::string::npos) << m;
  auto dead = o;
  dead.endpoint = "http://127.0.0.1:9";
  m = error_of([&] { resolve("Qwen3.6-27B", dead); });
  EXPECT_NE(m.find("cannot reach the hub"), std::string::npos) << m;
  for (const auto& text : {"nobody/Nothing-GGUF:x.gguf", "someone/Private-GGUF:p.gguf"})
    EXPECT_EQ(error_of([&] { resolve(text, o); }).find('\n'), std::string::npos);
  EXPECT_FALSE(fs::exists(repo_dir("nobody/Nothing-GGUF") + "/snapshots"));
}

TEST_F(HubTest, UnreachableOrFailingHubFallsBackToTheCache) {
  const auto r = resolve("Qwen3.6-27B", options());
  auto dead = options();
  dead.endpoint = "http://127.0.0.1:9";
  std::string note;
  dead.notice = [&](const std::string& line) { note = line; };
  EXPECT_EQ(resolve("Qwen3.6-27B", dead).path, r.path);
  EXPECT_NE(note.find("using the cached"), std::string::npos) << note;
  // A 500 with the file cached: the cache stands (as huggingface_hub).
  auto config = hub_config();
  config["repos"]["ggml-org/Qwen3.6-27B-GGUF"]["status"] = 500;
  hub_->set_config(config);
  EXPECT_EQ(resolve("Qwen3.6-27B", options()).path, r.path);
}

TEST_F(HubTest, FullDiskIsAnErrorAndLeavesNothingComplete) {
  auto config = hub_config();
  config["advertise_size"] = 1ull << 55;  // 32 PiB: more than any disk here
  hub_->set_config(config);
  std::string m = error_of([&] { resolve("Qwen3.6-27B:Q8_0", options()); });
  EXPECT_NE(m.find("not enough disk space"), std::string::npos) << m;
  EXPECT_NE(m.find("Qwen3.6-27B:Q8_0"), std::string::npos) << m;
  EXPECT_TRUE(requests("cdn").empty());  // checked before a byte is fetched

  // A disk that fills up during the download: the partial file is /dev/full.
  hub_->set_config(hub_config());
  const std::string blobs = repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/blobs/";
  const std::string etag = sha256_of(kTinyModel);
  fs::create_directories(blobs);
  fs::create_symlink("/dev/full", blobs + etag + ".incomplete");
  m = error_of([&] { resolve("Qwen3.6-27B:Q8_0", options()); });
  EXPECT_NE(m.find("disk full"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(blobs + etag));
}

// ---- the binary -------------------------------------------------------------------------------

TEST_F(HubTest, CommandLinePullLsInfoAndRun) {
  const std::string env = "HF_HUB_CACHE=" + cache_ + " HF_ENDPOINT=http://127.0.0.1:9 " +
                          "QWENRT_HF_ENDPOINT=" + hub_->endpoint() +
                          " HF_TOKEN= HF_HUB_OFFLINE=0 LLAMA_CACHE=" + cache_ + "/llama ";
  auto run = [&](const std::string& args) { return testing_support::run_qwenrt_env(env, args); };
  auto o = run("pull Qwen3.6-27B");
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string path =
      repo_dir("ggml-org/Qwen3.6-27B-GGUF") + "/snapshots/" + kCommit + "/Qwen3.6-27B-Q4_K_M.gguf";
  EXPECT_EQ(o.out, path + "\n");
  EXPECT_NE(o.err.find("downloaded"), std::string::npos) << o.err;

  o = run("pull someone/Tiny-GGUF:Q8_0 --drafter mtp");
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string tiny = repo_dir("someone/Tiny-GGUF") + "/snapshots/" + kCommit2 + "/";
  EXPECT_EQ(o.out, tiny + "Tiny-Q8_0.gguf\n" + tiny + "mtp-Tiny-Q8_0.gguf\n");
  o = run("pull someone/Tiny-GGUF:Q8_0 --drafter dflash");
  EXPECT_EQ(o.code, 1);
  EXPECT_NE(o.err.find("has no dflash-*.gguf drafter"), std::string::npos) << o.err;
  fs::remove_all(repo_dir("someone/Tiny-GGUF"));

  o = run("ls");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("Qwen3.6-27B:Q4_K_M"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("6.1 MiB"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("main"), std::string::npos) << o.out;
  o = run("ls --json");
  const auto listing = json::parse(o.out);
  ASSERT_EQ(listing["files"].size(), 1u);
  EXPECT_EQ(listing["files"][0]["size"], fs::file_size(official_file()));

  o = run("info -hf Qwen3.6-27B");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("checkpoint:    Qwen3.6-27B\n"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("chat dialect qwen3.6"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("no thinking  temperature 0.7, top_p 0.8, top_k 20"), std::string::npos);
  EXPECT_NE(o.out.find("drafter      mtp (1 block in the file), 7 drafts a check"),
            std::string::npos)
      << o.out;
  o = run("info Qwen3.6-27B --json");
  const auto info = json::parse(o.out);
  EXPECT_EQ(info["qwenrt"]["checkpoint"], "Qwen3.6-27B");
  EXPECT_EQ(info["qwenrt"]["source"]["commit"], kCommit);
  EXPECT_EQ(info["qwenrt"]["sampling"]["thinking"]["top_k"], 20);
  EXPECT_EQ(info["qwenrt"]["stop_tokens"].size(), 2u);
  EXPECT_EQ(info["qwenrt"]["drafter"]["kind"], "mtp");
  EXPECT_EQ(info["qwenrt"]["drafter"]["depth"], 7);

  // Offline, a cached name runs; an uncached one is one line and exit code 1.
  o = testing_support::run_qwenrt_env(env + "HF_HUB_OFFLINE=1",
                                      "run -m Qwen3.6-27B -p 'What is 2 + 2?' -n 4 --temp 0");
  EXPECT_EQ(o.code, 0) << o.err;
  o = testing_support::run_qwenrt_env(env + "HF_HUB_OFFLINE=1", "run -m Qwen3.8-27B -p hi");
  EXPECT_EQ(o.code, 1);
  EXPECT_NE(o.err.find("qwenrt: error: Qwen3.8-27B: "), std::string::npos) << o.err;
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
}

}  // namespace
}  // namespace qwenrt
