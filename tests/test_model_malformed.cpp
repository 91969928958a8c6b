// Model metadata on bad input: the model-level corpus (tests/fixtures/malformed/model/, written
// by tools/make_malformed_gguf.py with its manifest.json). Each file is a well-formed GGUF that
// the reader opens; model::Config must refuse it with one line naming the file and the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "model/config.h"

namespace qwenrt::model {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/malformed/model";

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(kDir + "/manifest.json");
    EXPECT_TRUE(in) << "missing manifest: run tools/make_malformed_gguf.py";
    return in ? nlohmann::json::parse(in) : nlohmann::json::object();
  }();
  return m;
}

gguf::File open_file(const std::string& name) {
  auto file = gguf::File::open(kDir + "/" + name);
  if (!file.ok()) ADD_FAILURE() << name << ": the reader refused it: " << file.error();
  return std::move(*file);
}

TEST(ModelMalformed, ManifestListsEveryCorpusFile) {
  std::set<std::string> on_disk;
  for (const auto& entry : fs::directory_iterator(kDir)) {
    if (entry.path().extension() == ".gguf") on_disk.insert(entry.path().filename().string());
  }
  std::set<std::string> listed;
  for (const auto& [name, _] : manifest().at("malformed").items()) listed.insert(name);
  for (const auto& name : manifest().at("valid")) listed.insert(name.get<std::string>());
  EXPECT_EQ(on_disk, listed) << "regenerate with tools/make_malformed_gguf.py";
  EXPECT_GE(manifest().at("malformed").size(), 25u);
}

TEST(ModelMalformed, ControlParses) {
  for (const auto& name : manifest().at("valid")) {
    SCOPED_TRACE(name.get<std::string>());
    const gguf::File file = open_file(name);
    const Config c = Config::from_gguf(file);
    EXPECT_TRUE(c.is_qwen4exp());
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_TRUE(c.is_attention_layer(0));
    EXPECT_FALSE(c.is_attention_layer(1));
    EXPECT_TRUE(c.is_qsa_layer(0));
    EXPECT_EQ(c.q4.ple_layer, 1);
    EXPECT_EQ(c.q4.ple_heads(), 4);
    EXPECT_EQ(c.q4.ple_rows, 36);
  }
}

TEST(ModelMalformed, EveryFileIsRefusedNamingFileAndKey) {
  for (const auto& [name, expected] : manifest().at("malformed").items()) {
    SCOPED_TRACE(name);
    const gguf::File file = open_file(name);
    try {
      (void)Config::from_gguf(file);
      ADD_FAILURE() << "the model config accepted " << name;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file.path()), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << "message spans lines: " << message;
      for (const auto& needle : expected.get<std::vector<std::string>>()) {
        EXPECT_NE(message.find(needle), std::string::npos)
            << "expected '" << needle << "' in: " << message;
      }
    }
  }
}

}  // namespace
}  // namespace qwenrt::model
