// Model resolution (src/hub) without a server: the Hugging Face cache's environment, names of
// checkpoints, repos, files and quants, identities, and the download progress line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "hub/cache.h"
#include "hub/model_ref.h"
#include "hub/progress.h"
#include "hub/resolve.h"
#include "model/identity.h"
#include "support/hub_env.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

namespace fs = std::filesystem;

const std::string kTinyModel =
    std::string(QWENRT_SOURCE_DIR) + "/models/qwen35-chat-tiny.Q8_0.gguf";

using testing_support::env_of;

// ---- the environment ------------------------------------------------------------------------

TEST(HubEnv, CacheDirFollowsHuggingFaceHubOrder) {
  std::map<std::string, std::string> vars = {
      {"HF_HUB_CACHE", "/a"}, {"HF_HOME", "/b"}, {"XDG_CACHE_HOME", "/c"}, {"HOME", "/d"}};
  EXPECT_EQ(hub::cache_dir(env_of(vars)), "/a");
  vars.erase("HF_HUB_CACHE");
  EXPECT_EQ(hub::cache_dir(env_of(vars)), "/b/hub");
  vars.erase("HF_HOME");
  EXPECT_EQ(hub::cache_dir(env_of(vars)), "/c/huggingface/hub");
  vars.erase("XDG_CACHE_HOME");
  EXPECT_EQ(hub::cache_dir(env_of(vars)), "/d/.cache/huggingface/hub");
  vars["HF_HOME"] = "";  // set but empty counts as unset
  EXPECT_EQ(hub::cache_dir(env_of(vars)), "/d/.cache/huggingface/hub");
  EXPECT_THROW(hub::cache_dir(env_of({})), Error);
}

TEST(HubEnv, TokenFromVariableThenTokenFile) {
  const std::string home = testing_support::temp_path("hf-home");
  fs::create_directories(home);
  std::ofstream(home + "/token") << "hf_fromfile\n";
  EXPECT_EQ(hub::access_token(env_of({{"HF_TOKEN", "hf_var"}, {"HF_HOME", home}})), "hf_var");
  EXPECT_EQ(hub::access_token(env_of({{"HF_HOME", home}})), "hf_fromfile");
  const std::string other = home + "/other-token";
  std::ofstream(other) << "  hf_other \n";
  EXPECT_EQ(hub::access_token(env_of({{"HF_HOME", home}, {"HF_TOKEN_PATH", other}})), "hf_other");
  // The default token file sits in ~/.cache/huggingface when HF_HOME is unset.
  const std::string xdg = testing_support::temp_path("xdg");
  fs::create_directories(xdg + "/huggingface");
  std::ofstream(xdg + "/huggingface/token") << "hf_xdg";
  EXPECT_EQ(hub::access_token(env_of({{"XDG_CACHE_HOME", xdg}})), "hf_xdg");
  EXPECT_EQ(hub::access_token(env_of({{"HOME", "/nonexistent"}})), std::nullopt);
}

TEST(HubEnv, OptionsFromEnvironment) {
  auto o = hub::hub_options(env_of({{"HOME", "/h"},
                                    {"HF_ENDPOINT", "http://hf.example/"},
                                    {"HF_HUB_OFFLINE", "1"},
                                    {"HF_TOKEN", "t"}}));
  EXPECT_EQ(o.endpoint, "http://hf.example");
  EXPECT_TRUE(o.offline);
  EXPECT_EQ(o.token, "t");
  o = hub::hub_options(env_of({{"HOME", "/h"},
                               {"HF_ENDPOINT", "http://hf.example"},
                               {"QWENRT_HF_ENDPOINT", "http://ours.example"},
                               {"HF_HUB_OFFLINE", "0"}}));
  EXPECT_EQ(o.endpoint, "http://ours.example");
  EXPECT_FALSE(o.offline);
  EXPECT_EQ(hub::hub_options(env_of({{"HOME", "/h"}})).endpoint, "https://huggingface.co");
  EXPECT_TRUE(hub::hub_options(env_of({{"HOME", "/h"}, {"HF_HUB_OFFLINE", "true"}})).offline);
  o = hub::hub_options(
      env_of({{"HOME", "/h"}, {"HF_HUB_ETAG_TIMEOUT", "3"}, {"HF_HUB_DOWNLOAD_TIMEOUT", "7.5"}}));
  EXPECT_EQ(o.connect_timeout_s, 3);
  EXPECT_EQ(o.stall_timeout_s, 8);
  EXPECT_EQ(hub::hub_options(env_of({{"HOME", "/h"}})).stall_timeout_s, 30);
  EXPECT_THROW(hub::hub_options(env_of({{"HOME", "/h"}, {"HF_HUB_ETAG_TIMEOUT", "soon"}})), Error);
}

// ---- names ----------------------------------------------------------------------------------

TEST(HubNames, OfficialNamesMapToGgmlOrgRepos) {
  auto r = hub::parse_model_ref("Qwen3.6-35B-A3B", false);
  EXPECT_FALSE(r.is_path);
  EXPECT_EQ(r.repo, "ggml-org/Qwen3.6-35B-A3B-GGUF");
  EXPECT_EQ(r.file, "Qwen3.6-35B-A3B-Q4_K_M.gguf");
  EXPECT_EQ(r.official, model::Checkpoint::kQwen36_35B_A3B);
  r = hub::parse_model_ref("Qwen3.8-27B:q8_0", true);
  EXPECT_EQ(r.repo, "ggml-org/Qwen3.8-27B-GGUF");
  EXPECT_EQ(r.file, "Qwen3.8-27B-Q8_0.gguf");
  EXPECT_EQ(hub::official_repos().size(), 3u);
}

TEST(HubNames, ReposFilesQuantsAndPaths) {
  auto r = hub::parse_model_ref("unsloth/Qwen3.6-27B-GGUF:Qwen3.6-27B-Q6_K.gguf", false);
  EXPECT_EQ(r.repo, "unsloth/Qwen3.6-27B-GGUF");
  EXPECT_EQ(r.file, "Qwen3.6-27B-Q6_K.gguf");
  r = hub::parse_model_ref("unsloth/Qwen3.6-27B-GGUF:iq4_xs", false);
  EXPECT_TRUE(r.file.empty());
  EXPECT_EQ(r.quant, "IQ4_XS");
  EXPECT_EQ(hub::parse_model_ref("unsloth/Qwen3.6-27B-GGUF", true).quant, "Q4_K_M");
  r = hub::parse_model_ref(kTinyModel, false);
  EXPECT_TRUE(r.is_path);
  EXPECT_EQ(r.path, kTinyModel);
}

TEST(HubNames, BadNamesGiveOneLineErrors) {
  auto message = [](const std::string& text, bool hub_only) {
    try {
      hub::parse_model_ref(text, hub_only);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("qwen3.6-27b", false).find("did you mean Qwen3.6-27B"), std::string::npos);
  EXPECT_NE(message("Qwen3.7-27B", false).find("not a checkpoint name"), std::string::npos);
  EXPECT_NE(message("missing.gguf", false).find("missing.gguf: no such file"), std::string::npos);
  EXPECT_NE(message("a/b/c", true).find("not a Hugging Face repo id"), std::string::npos);
  EXPECT_NE(message("a--b/c", true).find("not a Hugging Face repo id"), std::string::npos);
  EXPECT_NE(message("org/repo:../x.gguf", true).find("not a file path inside a repo"),
            std::string::npos);
  EXPECT_NE(message("org/repo:mmproj-F16.gguf", true).find("vision projector"), std::string::npos);
  EXPECT_NE(message("Qwen3.6-27B:", true).find("nothing after ':'"), std::string::npos);
  for (const auto& text : {"qwen3.6-27b", "Qwen3.7-27B", "missing.gguf", "a/b/c"})
    EXPECT_EQ(message(text, false).find('\n'), std::string::npos) << text;
}

TEST(HubNames, QuantChoosesOneTrunkFile) {
  const std::vector<std::string> files = {"README.md",
                                          "X-Q4_K_M.gguf",
                                          "X-UD-Q4_K_M.gguf",
                                          "mmproj-X-Q4_K_M.gguf",
                                          "mtp-X-Q4_K_M.gguf",
                                          "X-Q8_0.gguf",
                                          "big/X-Q6_K-00001-of-00002.gguf",
                                          "big/X-Q6_K-00002-of-00002.gguf",
                                          "X-Q4_K_M_L.gguf"};
  EXPECT_EQ(hub::choose_quant_file("o/X", files, "Q4_K_M"), "X-Q4_K_M.gguf");
  EXPECT_EQ(hub::choose_quant_file("o/X", files, "q8_0"), "X-Q8_0.gguf");
  EXPECT_EQ(hub::choose_quant_file("o/X", files, "Q6_K"), "big/X-Q6_K-00001-of-00002.gguf");
  try {  // a part missing from the listing
    hub::choose_quant_file("o/X", {"X-Q6_K-00001-of-00003.gguf", "X-Q6_K-00003-of-00003.gguf"},
                           "Q6_K");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split into 3 parts, but the repo has no "
                                         "X-Q6_K-00002-of-00003.gguf"),
              std::string::npos)
        << e.what();
  }
  // A whole file wins over parts of the same quant.
  EXPECT_EQ(hub::choose_quant_file("o/X", {"X-Q6_K-00001-of-00001.gguf", "X-Q6_K.gguf"}, "Q6_K"),
            "X-Q6_K.gguf");
  EXPECT_EQ(gguf::parse_split_name("a/X-Q6_K-00002-of-00003.gguf")->index, 1u);
  EXPECT_EQ(gguf::parse_split_name("a/X-Q6_K-00002-of-00003.gguf")->count, 3u);
  EXPECT_FALSE(gguf::parse_split_name("X-Q6_K-2-of-3.gguf"));
  EXPECT_FALSE(gguf::parse_split_name("X-Q6_K-00004-of-00003.gguf"));
  EXPECT_FALSE(gguf::parse_split_name("X-Q6_K-00000-of-00003.gguf"));
  try {
    hub::choose_quant_file("o/X", files, "Q2_K");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no Q2_K GGUF"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hub::choose_quant_file("o/X", {"a-Q8_0.gguf", "b-Q8_0.gguf"}, "Q8_0"), Error);
  EXPECT_EQ(hub::choose_sidecar_file("o/X", files, hub::SidecarKind::kMtp, "Q4_K_M"),
            "mtp-X-Q4_K_M.gguf");
  EXPECT_EQ(hub::choose_sidecar_file("o/X", files, hub::SidecarKind::kDflash, "Q4_K_M"),
            std::nullopt);
  EXPECT_EQ(hub::quant_of("Qwen3.6-35B-A3B-UD-Q4_K_XL.gguf"), "Q4_K_XL");
  EXPECT_EQ(hub::quant_of("model.gguf"), "");
}

TEST(Identity, NameOfTwoCheckpointsIsNeither) {
  using model::Checkpoint;
  EXPECT_EQ(model::identify_name("Qwen3.6-27B x Qwen3.8-27B merge", "").checkpoint,
            Checkpoint::kOther);
  EXPECT_EQ(model::identify_name("Qwen3.6-35B-A3B-vs-Qwen3.6-27B", "a.gguf").checkpoint,
            Checkpoint::kOther);
  // An ambiguous general.name is not rescued by the file name.
  EXPECT_EQ(model::identify_name("Qwen3.6-27B + Qwen3.8-27B", "Qwen3.8-27B-Q4_K_M.gguf").checkpoint,
            Checkpoint::kOther);
  EXPECT_EQ(model::identify_name("Qwen3.6-27B + Qwen3.8-27B", "").name,
            "Qwen3.6-27B + Qwen3.8-27B");
  EXPECT_EQ(model::identify_name("Qwen3.8-27B", "").checkpoint, Checkpoint::kQwen38_27B);
}

TEST(HubProgress, LineShowsPercentBytesSpeedAndTimeLeft) {
  const std::string line = hub::format_progress({.label = "ggml-org/X:X-Q4_K_M.gguf",
                                                 .done = 600'000'000,
                                                 .total = 1'000'000'000,
                                                 .resumed = 100'000'000,
                                                 .seconds = 5.0},
                                                10);
  // 500 MB in 5 s = 100 MB/s; 400 MB left = 4 s.
  EXPECT_EQ(line, "X-Q4_K_M.gguf [######....]  60% 0.60/1.00 GB 100.0 MB/s ETA 4s");
  const std::string done = hub::format_progress(
      {.label = "f.gguf", .done = 10, .total = 10, .seconds = 125, .finished = true}, 4);
  EXPECT_NE(done.find("100%"), std::string::npos);
  EXPECT_NE(done.find("0.00/0.00 MB"), std::string::npos) << done;
  EXPECT_NE(done.find("in 2m05s"), std::string::npos);
}

}  // namespace
}  // namespace qwenrt
