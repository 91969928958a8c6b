// The GGUF reader on bad input: the malformed corpus (tools/make_malformed_gguf.py writes it and
// tests/fixtures/malformed/manifest.json), truncation at every offset and byte flips of the valid
// controls, and `qwenrt info` on bad files. Every failure must be an Error naming the file and the
// broken rule; nothing may crash (the sanitizer build runs this too).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gguf/json.h"
#include "gguf/reader.h"
#include "support/model_files.h"

namespace qwenrt::gguf {
namespace {

namespace fs = std::filesystem;

const std::string kCorpusDir = std::string(QWENRT_SOURCE_DIR) + "/tests/fixtures/malformed";

std::string corpus_path(const std::string& name) {
  return kCorpusDir + "/" + name;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(corpus_path("manifest.json"));
    EXPECT_TRUE(in) << "missing manifest: run tools/make_malformed_gguf.py";
    return in ? nlohmann::json::parse(in) : nlohmann::json::object();
  }();
  return m;
}

// A manifest entry is one substring or a list of substrings the error must all contain.
std::vector<std::string> expected_substrings(const nlohmann::json& entry) {
  if (entry.is_string()) return {entry.get<std::string>()};
  return entry.get<std::vector<std::string>>();
}

// Reads everything an opened File exposes, the way a caller would, so that a sanitizer sees any
// bad index. Returns the number of metadata values visited (arrays counted item by item).
size_t touch_value(const Value& value) {
  size_t n = 1;
  if (value.type == ValueType::ARRAY) {
    for (const auto& item : value.as_array().items) n += touch_value(item);
  }
  return n;
}

void touch(const File& file) {
  for (const auto& kv : file.metadata()) {
    EXPECT_EQ(file.find(kv.key), &kv.value) << kv.key;
    EXPECT_GE(touch_value(kv.value), 1u);
    EXPECT_FALSE(kv.value.to_display().empty());
  }
  const uint64_t data_size = file.file_size() - file.data_offset();
  for (const auto& t : file.tensors()) {
    EXPECT_EQ(file.find_tensor(t.name), &t) << t.name;
    ASSERT_NE(t.data, nullptr) << t.name;
    ASSERT_GE(t.n_bytes, 1u) << t.name;
    ASSERT_LE(t.offset + t.n_bytes, data_size) << t.name;
    volatile uint8_t first = t.data[0];
    volatile uint8_t last = t.data[t.n_bytes - 1];
    (void)first;
    (void)last;
    EXPECT_GE(t.n_elements(), 1) << t.name;
    EXPECT_EQ(t.view().n_elements(), t.n_elements()) << t.name;
  }
  const std::string json =
      to_json(file).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXPECT_FALSE(json.empty());
}

// What a cut-off file may be blamed for: running out of bytes, in one of its phrasings.
bool is_truncation_message(const std::string& message) {
  for (const char* phrase : {"truncated", "cannot fit", "needs at least",
                             "lies outside the data section", "not a GGUF file"}) {
    if (message.find(phrase) != std::string::npos) return true;
  }
  return false;
}

TEST(GgufMalformed, ManifestListsEveryCorpusFile) {
  std::set<std::string> on_disk;
  for (const auto& entry : fs::directory_iterator(kCorpusDir)) {
    if (entry.path().extension() == ".gguf") on_disk.insert(entry.path().filename().string());
  }
  std::set<std::string> listed;
  for (const auto& [name, _] : manifest().at("malformed").items()) listed.insert(name);
  for (const auto& [name, _] : manifest().at("valid").items()) listed.insert(name);
  EXPECT_EQ(on_disk, listed) << "regenerate with tools/make_malformed_gguf.py";
  EXPECT_GE(manifest().at("malformed").size(), 80u);
  EXPECT_GE(manifest().at("valid").size(), 3u);
}

TEST(GgufMalformed, EveryMalformedFileFailsNamingFileAndRule) {
  for (const auto& [name, expected] : manifest().at("malformed").items()) {
    SCOPED_TRACE(name);
    const std::string path = corpus_path(name);
    auto file = File::open(path);
    ASSERT_FALSE(file.ok()) << "opened a malformed file";
    const std::string& message = file.error();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const auto& substring : expected_substrings(expected)) {
      EXPECT_NE(message.find(substring), std::string::npos)
          << "expected '" << substring << "' in: " << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message spans lines: " << message;

    // The same bytes from memory fail with the same message.
    const auto bytes = read_bytes(path);
    auto from_memory = File::from_bytes(bytes, path);
    ASSERT_FALSE(from_memory.ok());
    EXPECT_EQ(from_memory.error(), message);
  }
}

TEST(GgufMalformed, ValidControlsOpen) {
  for (const auto& [name, info] : manifest().at("valid").items()) {
    SCOPED_TRACE(name);
    auto file = File::open(corpus_path(name));
    ASSERT_TRUE(file.ok()) << file.error();
    EXPECT_EQ(file->metadata().size(), info.at("keys").get<size_t>());
    EXPECT_EQ(file->tensors().size(), info.at("tensors").get<size_t>());
    touch(*file);
    if (!file->tensors().empty()) {
      uint64_t data_end = 0;
      for (const auto& t : file->tensors()) data_end = std::max(data_end, t.offset + t.n_bytes);
      EXPECT_EQ(file->data_offset() + data_end, info.at("min_size").get<uint64_t>());
    }
  }
}

TEST(GgufMalformed, ValidControlsCarryEveryValueType) {
  auto file = File::open(corpus_path("valid_all_types.gguf"));
  ASSERT_TRUE(file.ok()) << file.error();
  std::set<ValueType> scalar_types, array_elem_types;
  for (const auto& kv : file->metadata()) {
    scalar_types.insert(kv.value.type);
    if (kv.value.type == ValueType::ARRAY) array_elem_types.insert(kv.value.as_array().elem_type);
  }
  EXPECT_EQ(scalar_types.size(), 13u);
  EXPECT_EQ(array_elem_types.size(), 13u);
  EXPECT_EQ(file->get_uint("test.u64"), UINT64_MAX);
  EXPECT_EQ(file->get_int("test.i64"), INT64_MIN);
  EXPECT_EQ(file->get_string("test.string_empty"), "");
  EXPECT_EQ(file->get_array("tokenizer.ggml.tokens")->items.at(3).as_string(), "\xc4\xa0world");
  const Array* depth4 = file->get_array("test.arr_depth4");
  ASSERT_NE(depth4, nullptr);
  const Value* leaf = &depth4->items.at(0);
  for (int level = 0; level < 3; ++level) leaf = &leaf->as_array().items.at(0);
  EXPECT_EQ(leaf->to_display(), "7");
}

TEST(GgufMalformed, LimitsAreHonoured) {
  const auto bytes = read_bytes(corpus_path("valid_all_types.gguf"));
  auto shallow = File::from_bytes(bytes, "shallow", {.max_array_depth = 3});
  ASSERT_FALSE(shallow.ok());
  EXPECT_NE(shallow.error().find("key 'test.arr_depth4': arrays nested deeper than 3 levels"),
            std::string::npos)
      << shallow.error();
  auto short_strings = File::from_bytes(bytes, "short", {.max_string_bytes = 16});
  ASSERT_FALSE(short_strings.ok());
  EXPECT_NE(short_strings.error().find("exceeds the limit of 16 bytes"), std::string::npos)
      << short_strings.error();
  auto few_items = File::from_bytes(bytes, "few", {.max_array_items = 4});
  ASSERT_FALSE(few_items.ok());
  EXPECT_NE(few_items.error().find("array length 10 exceeds the limit of 4"), std::string::npos)
      << few_items.error();
  auto few_tensors = File::from_bytes(bytes, "few", {.max_tensors = 7});
  ASSERT_FALSE(few_tensors.ok());
  EXPECT_NE(few_tensors.error().find("tensor count 8 exceeds the limit of 7"), std::string::npos)
      << few_tensors.error();
  auto few_keys = File::from_bytes(bytes, "few", {.max_keys = 31});
  ASSERT_FALSE(few_keys.ok());
  EXPECT_NE(few_keys.error().find("metadata key count 32 exceeds the limit of 31"),
            std::string::npos)
      << few_keys.error();
  auto short_names = File::from_bytes(bytes, "short", {.max_tensor_name_bytes = 8});
  ASSERT_FALSE(short_names.ok());
  EXPECT_NE(short_names.error().find("tensor #0 name"), std::string::npos) << short_names.error();
  auto small_alignment = File::from_bytes(bytes, "small", {.max_alignment = 16});
  ASSERT_FALSE(small_alignment.ok());
  EXPECT_NE(small_alignment.error().find("general.alignment: 32 exceeds the limit of 16"),
            std::string::npos)
      << small_alignment.error();
}

// Every prefix shorter than the end of the last tensor's data (or, without tensors, the end of
// the tensor table) must fail as a truncation; every longer prefix opens.
TEST(GgufMalformed, TruncatedControlsFailAtEveryOffset) {
  for (const auto& [name, info] : manifest().at("valid").items()) {
    SCOPED_TRACE(name);
    const auto bytes = read_bytes(corpus_path(name));
    const size_t min_size = info.at("min_size").get<size_t>();
    ASSERT_LE(min_size, bytes.size());
    for (size_t cut = 0; cut <= bytes.size(); ++cut) {
      auto file = File::from_bytes(std::span(bytes).first(cut), "cut-" + name);
      if (cut < min_size) {
        ASSERT_FALSE(file.ok()) << "a " << cut << "-byte prefix opened";
        ASSERT_TRUE(is_truncation_message(file.error())) << "cut " << cut << ": " << file.error();
        ASSERT_NE(file.error().find("cut-" + name), std::string::npos) << file.error();
      } else {
        ASSERT_TRUE(file.ok()) << "cut " << cut << ": " << file.error();
        touch(*file);
      }
    }
  }
}

// Any single-byte change either opens (and is then safe to read) or fails with an Error.
TEST(GgufMalformed, ByteFlipsNeverCrash) {
  for (const auto& [name, _] : manifest().at("valid").items()) {
    SCOPED_TRACE(name);
    auto bytes = read_bytes(corpus_path(name));
    size_t opened = 0, failed = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      const uint8_t original = bytes[i];
      for (uint8_t mask : {0x01, 0x10, 0x80, 0xff}) {
        bytes[i] = original ^ mask;
        auto file = File::from_bytes(bytes, name);
        if (file.ok()) {
          touch(*file);
          ++opened;
        } else {
          ASSERT_NE(file.error().find(name), std::string::npos) << file.error();
          ASSERT_EQ(file.error().find('\n'), std::string::npos) << file.error();
          ++failed;
        }
      }
      bytes[i] = original;
    }
    // Flips in tensor data and string contents keep the file valid; flips in sizes break it.
    EXPECT_GT(opened, 0u);
    EXPECT_GT(failed, 0u);
  }
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

CommandResult run_info(const std::string& path) {
  const std::string stem = testing_support::temp_path("qwenrt_info");
  const std::string out_path = stem + ".stdout";
  const std::string err_path = stem + ".stderr";
  const std::string command = std::string("'") + QWENRT_BINARY + "' info '" + path + "' >'" +
                              out_path + "' 2>'" + err_path + "'";
  const int status = std::system(command.c_str());
  CommandResult result;
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  const auto out = read_bytes(out_path);
  const auto err = read_bytes(err_path);
  result.out.assign(out.begin(), out.end());
  result.err.assign(err.begin(), err.end());
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return result;
}

TEST(GgufMalformed, InfoCommandReportsOneLineAndExitsOne) {
  for (const std::string name :
       {"magic_ggml.gguf", "version_big_endian.gguf", "truncated_at_0121.gguf", "n_dims_5.gguf",
        "overlap_partial.gguf", "array_nested_depth64.gguf", "key_duplicate.gguf"}) {
    SCOPED_TRACE(name);
    const std::string path = corpus_path(name);
    const CommandResult r = run_info(path);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_TRUE(r.out.empty()) << r.out;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.back(), '\n') << r.err;
    EXPECT_EQ(r.err.rfind("qwenrt: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
    for (const auto& substring : expected_substrings(manifest().at("malformed").at(name))) {
      EXPECT_NE(r.err.find(substring), std::string::npos) << r.err;
    }
  }
  const CommandResult ok = run_info(corpus_path("valid_all_types.gguf"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(ok.err.empty()) << ok.err;
  EXPECT_NE(ok.out.find("architecture:  qwen35"), std::string::npos) << ok.out;
}

}  // namespace
}  // namespace qwenrt::gguf
