// Split GGUFs (gguf/reader.h, gguf/split.h): a model written as parts reads as the one file it was
// (keys, tensors, bytes), runs to the same logits bit for bit, streams its experts from every
// part, and every way a set of parts can be wrong is refused naming the part and the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "engine/engine.h"
#include "gguf/reader.h"
#include "gguf/split.h"
#include "support/engine_steps.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

namespace fs = std::filesystem;
using testing_support::temp_path;

std::string error_of(const std::string& path) {
  auto f = gguf::File::open(path);
  return f.ok() ? "no error" : f.error();
}

// A folder of its own for each set of parts.
std::string fresh_dir(const std::string& name) {
  const std::string dir = temp_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(GgufSplit, PartNames) {
  EXPECT_EQ(gguf::split_part_path("a/x-00001-of-00003.gguf", 2, 3), "a/x-00003-of-00003.gguf");
  EXPECT_EQ(gguf::split_part_path("a/x-00001-of-00003.gguf", 0, 3), "a/x-00001-of-00003.gguf");
  EXPECT_EQ(gguf::split_part_path("a/x-00001-of-00003.gguf", 3, 3), std::nullopt);
  EXPECT_EQ(gguf::split_part_path("a/x-00001-of-00004.gguf", 1, 3), std::nullopt);
  EXPECT_EQ(gguf::split_part_path("a/x-00002-of-00003.gguf", 1, 3), std::nullopt);
  EXPECT_EQ(gguf::split_part_path("x.gguf", 1, 3), std::nullopt);
}

TEST(GgufSplit, PartsReadAsTheOneFile) {
  const std::string whole = testing_support::write_tiny(model::Arch::kQwen35Moe, "split_src.gguf");
  const gguf::File src = gguf::File::open(whole).value();
  const auto paths = gguf::write_split(src, fresh_dir("split_a") + "/m", {.max_part_tensors = 9});
  const uint64_t n_parts = (src.tensors().size() + 8) / 9;
  ASSERT_EQ(paths.size(), n_parts);
  ASSERT_GE(n_parts, 3u);
  EXPECT_TRUE(paths[0].ends_with(fmt::format("m-00001-of-{:05}.gguf", n_parts))) << paths[0];

  const gguf::File f = gguf::File::open(paths[0]).value();
  // Every key of the source, same type and value, and the split keys.
  for (const auto& kv : src.metadata()) {
    const gguf::Value* v = f.find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->type, kv.value.type) << kv.key;
    EXPECT_EQ(v->to_display(), kv.value.to_display()) << kv.key;
  }
  EXPECT_EQ(f.get_uint("split.no"), 0u);
  EXPECT_EQ(f.get_uint("split.count"), n_parts);
  EXPECT_EQ(f.get_uint("split.tensors.count"), src.tensors().size());
  EXPECT_EQ(f.metadata().size(), src.metadata().size() + 3);
  // Every tensor, in order, with its bytes; parts in order, 9 tensors each.
  ASSERT_EQ(f.tensors().size(), src.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = src.tensors()[i];
    const auto& b = f.tensors()[i];
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.dtype, a.dtype) << a.name;
    EXPECT_EQ(b.ne, a.ne) << a.name;
    ASSERT_EQ(b.n_bytes, a.n_bytes) << a.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
    EXPECT_EQ(b.part, static_cast<int>(i / 9)) << a.name;
    EXPECT_EQ(f.find_tensor(a.name), &b);
  }
  // The parts: paths, sizes on disk, and each tensor inside its part's mapping.
  const auto parts = f.parts();
  ASSERT_EQ(parts.size(), n_parts);
  uint64_t total = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    EXPECT_EQ(parts[p].path, paths[p]);
    EXPECT_EQ(parts[p].size, fs::file_size(paths[p]));
    total += parts[p].size;
  }
  EXPECT_EQ(f.file_size(), total);
  for (const auto& t : f.tensors()) {
    const auto& p = parts[t.part];
    EXPECT_EQ(t.data, p.base + p.data_offset + t.offset) << t.name;
  }
  // One part only (a limit above the whole file): split keys with a count of 1 read as a file.
  const auto one = gguf::write_split(src, fresh_dir("split_one") + "/m", {});
  ASSERT_EQ(one.size(), 1u);
  const gguf::File single = gguf::File::open(one[0]).value();
  EXPECT_EQ(single.parts().size(), 1u);
  EXPECT_EQ(single.tensors().size(), src.tensors().size());
  // A byte limit: no part beyond it but for a tensor larger than the limit alone.
  const uint64_t limit = 40000;
  const auto by_bytes =
      gguf::write_split(src, fresh_dir("split_bytes") + "/m", {.max_part_bytes = limit});
  const gguf::File fb = gguf::File::open(by_bytes[0]).value();
  std::vector<uint64_t> bytes(by_bytes.size()), count(by_bytes.size());
  for (const auto& t : fb.tensors()) {
    bytes[t.part] += t.n_bytes;
    ++count[t.part];
  }
  for (size_t p = 0; p < bytes.size(); ++p)
    EXPECT_TRUE(bytes[p] <= limit || count[p] == 1) << p << ": " << bytes[p];
  EXPECT_GT(by_bytes.size(), 1u);
}

// Prefill of 20 tokens and 6 decode steps on the cpu backend: every step's logits.
std::vector<float> logits_of(const std::string& path, int64_t expert_cache_bytes) {
  engine::EngineOptions o;
  o.backend = "cpu";
  o.n_threads = 2;
  o.expert_cache_bytes = expert_cache_bytes;
  auto e = engine::Engine::load(path, o);
  const auto all = testing_support::prefill_then_decode(
      *e, testing_support::random_tokens(26, e->config().n_vocab, 3), 20);
  if (expert_cache_bytes > 0) {
    const auto st = e->backend().expert_stats();
    EXPECT_GT(st.loads, 0);
  }
  return all;
}

TEST(GgufSplit, ModelRunsTheSameAndStreamsExpertsFromEveryPart) {
  const std::string whole =
      testing_support::write_tiny(model::Arch::kQwen35Moe, "split_model.gguf");
  const gguf::File src = gguf::File::open(whole).value();
  // Parts of 5 tensors: the layers' expert tensors land in different parts.
  const auto paths = gguf::write_split(src, fresh_dir("split_m") + "/m", {.max_part_tensors = 5});
  const gguf::File f = gguf::File::open(paths[0]).value();
  std::set<int> expert_parts;
  int64_t slot = 0;
  for (const auto& t : f.tensors()) {
    if (t.name.find("_exps.") == std::string::npos) continue;
    expert_parts.insert(t.part);
    if (t.name.starts_with("blk.0.")) slot += (t.n_bytes / t.ne[2] + 63) / 64 * 64;
  }
  ASSERT_GE(expert_parts.size(), 3u);
  const auto mapped = logits_of(whole, 0);
  EXPECT_TRUE(logits_of(paths[0], 0) == mapped) << "split file: logits differ";
  const auto cfg = engine::Engine::load(whole, {.backend = "ref"})->config();
  EXPECT_TRUE(logits_of(paths[0], (cfg.n_expert_used + 1) * slot) == mapped)
      << "experts streamed from the parts: logits differ";
}

// Parts of a three-part split of the tiny dense model, in a folder of their own.
std::vector<std::string> three_parts(const std::string& name) {
  static const std::string whole =
      testing_support::write_tiny(model::Arch::kQwen35, "split_dense.gguf");
  const gguf::File src = gguf::File::open(whole).value();
  const uint64_t per_part = (src.tensors().size() + 2) / 3;
  auto paths = gguf::write_split(src, fresh_dir(name) + "/d", {.max_part_tensors = per_part});
  EXPECT_EQ(paths.size(), 3u);
  return paths;
}

void expect_has(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(GgufSplit, BadPartsAreRefusedNamingThem) {
  {  // A later part opened: say which file to open.
    const auto p = three_parts("bad_later");
    const std::string m = error_of(p[1]);
    expect_has(m, "part 2 of a split GGUF of 3 parts");
    expect_has(m, "open " + p[0]);
    // Read alone on purpose (tools rewriting parts): its own keys and tensors only.
    const gguf::File alone = gguf::File::open(p[1], {.single_part = true}).value();
    EXPECT_EQ(alone.get_uint("split.no"), 1u);
    EXPECT_EQ(alone.parts().size(), 1u);
    const gguf::File all = gguf::File::open(p[0]).value();
    EXPECT_EQ(alone.tensors().front().name,
              (std::find_if(all.tensors().begin(), all.tensors().end(), [](const auto& t) {
                return t.part == 1;
              }))->name);
  }
  {  // A part missing.
    const auto p = three_parts("bad_missing");
    fs::remove(p[2]);
    const std::string m = error_of(p[0]);
    expect_has(m, p[2]);
  }
  {  // Parts out of order.
    const auto p = three_parts("bad_order");
    fs::rename(p[1], p[1] + ".tmp");
    fs::rename(p[2], p[1]);
    fs::rename(p[1] + ".tmp", p[2]);
    expect_has(error_of(p[0]), "(part 2 of 3): split.no is 2, expected 1");
  }
  {  // A part of another split.
    const auto p = three_parts("bad_other");
    const gguf::File src = gguf::File::open(p[0]).value();
    const auto two = gguf::write_split(src, fresh_dir("bad_other_two") + "/d",
                                       {.max_part_tensors = (src.tensors().size() + 1) / 2});
    ASSERT_EQ(two.size(), 2u);
    fs::copy_file(two[1], p[1], fs::copy_options::overwrite_existing);
    expect_has(error_of(p[0]), "split.count is 2, the first part's is 3");
  }
  {  // The first part renamed: its parts cannot be found.
    const auto p = three_parts("bad_name");
    const std::string renamed = fs::path(p[0]).parent_path() / "model.gguf";
    fs::rename(p[0], renamed);
    expect_has(error_of(renamed), "does not end in -00001-of-00003.gguf");
  }
  {  // The tensor count: parts that disagree, then parts that agree on a wrong one.
    const auto p = three_parts("bad_count");
    auto set_count = [](const std::string& path) {
      testing_support::rewrite(path, path + ".new", [](auto& kv, auto&, auto&) {
        for (auto& [key, value] : kv) {
          if (key == "split.tensors.count") value = gguf::Value::i32(999);
        }
      });
      fs::rename(path + ".new", path);
    };
    const size_t n = gguf::File::open(p[0]).value().tensors().size();
    set_count(p[0]);
    expect_has(error_of(p[0]), fmt::format("(part 2 of 3): split.tensors.count is {}, the first "
                                           "part's is 999",
                                           n));
    set_count(p[1]);
    set_count(p[2]);
    expect_has(error_of(p[0]), fmt::format("split.tensors.count is 999, the 3 parts hold {} "
                                           "tensors",
                                           n));
  }
  {  // One tensor in two parts.
    const auto p = three_parts("bad_dup");
    const gguf::File first = gguf::File::open(p[0]).value();
    const std::string name = first.tensors().front().name;
    testing_support::rewrite(p[2], p[2] + ".new", [&](auto&, auto& tensors, auto& order) {
      tensors[name] = tensors.begin()->second;
      order.push_back(name);
    });
    fs::rename(p[2] + ".new", p[2]);
    expect_has(error_of(p[0]), fmt::format("tensor '{}' is also in part 1", name));
  }
  {  // The first part's bytes alone (tests, the fuzzer): refused, not half a model.
    const auto p = three_parts("bad_bytes");
    MappedFile m = MappedFile::open(p[0]);
    auto f = gguf::File::from_bytes(m.bytes(), p[0]);
    ASSERT_FALSE(f.ok());
    expect_has(f.error(), "its other parts are read from files");
  }
  {  // Split keys out of range on a single file.
    const std::string whole = temp_path("split_dense.gguf");
    auto with = [&](const std::string& name, std::vector<gguf::KeyValue> add) {
      const std::string out = temp_path(name);
      testing_support::rewrite(
          whole, out, [&](auto& kv, auto&, auto&) { kv.insert(kv.end(), add.begin(), add.end()); });
      return error_of(out);
    };
    expect_has(with("split0-00001-of-00001.gguf", {{"split.count", gguf::Value::u16(0)}}),
               "split.count is 0");
    expect_has(with("splitno-00001-of-00003.gguf", {{"split.count", gguf::Value::u16(3)}}),
               "split.count is 3 but split.no is missing");
    expect_has(with("splithigh-00001-of-00003.gguf",
                    {{"split.count", gguf::Value::u16(3)}, {"split.no", gguf::Value::u16(3)}}),
               "split.no 3 is not below split.count 3");
    expect_has(with("splittype-00001-of-00003.gguf", {{"split.count", gguf::Value::str("3")}}),
               "split.count");
    expect_has(with("splitbig-00001-of-02000.gguf",
                    {{"split.count", gguf::Value::u16(2000)}, {"split.no", gguf::Value::u16(0)}}),
               "exceeds the limit of 1024 parts");
  }
}

}  // namespace
}  // namespace qwenrt
