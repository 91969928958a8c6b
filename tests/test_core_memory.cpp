// available_memory(): MemAvailable capped by the memory cgroups the process runs under, over fake
// /proc and cgroup trees in the v1, v2 and hybrid layouts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/memory.h"
#include "support/model_files.h"

namespace qwenrt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGiB = int64_t{1} << 30;

struct Tree {
  std::string root;
  explicit Tree(const std::string& name) : root(testing_support::temp_path(name)) {
    fs::remove_all(root);
    fs::create_directories(root + "/proc/self");
    fs::create_directories(root + "/cg");
  }
  void write(const std::string& path, const std::string& text) const {
    fs::create_directories(fs::path(root + "/" + path).parent_path());
    std::ofstream(root + "/" + path) << text;
  }
  void meminfo(int64_t available_kib) const {
    write("proc/meminfo", "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   " +
                              std::to_string(available_kib) + " kB\n");
  }
  int64_t available() const { return available_memory(root + "/proc", root + "/cg"); }
};

TEST(CoreMemory, NoCgroupLimitIsMemAvailable) {
  Tree t("mem_none");
  t.meminfo(8 * 1024 * 1024);
  t.write("proc/self/cgroup", "4:memory:/user.slice\n0::/user.slice\n");
  t.write("cg/memory/user.slice/memory.limit_in_bytes", "9223372036854771712\n");
  t.write("cg/memory.max", "max\n");
  EXPECT_EQ(t.available(), 8 * kGiB);
}

TEST(CoreMemory, V1LimitCapsMemAvailable) {
  Tree t("mem_v1");
  t.meminfo(20 * 1024 * 1024);
  t.write("proc/self/cgroup", "9:cpu,cpuacct:/box\n4:memory:/box/job\n0::/\n");
  const std::string dir = "cg/memory/box/job/";
  t.write(dir + "memory.limit_in_bytes", std::to_string(4 * kGiB) + "\n");
  t.write(dir + "memory.usage_in_bytes", std::to_string(3 * kGiB) + "\n");
  // 1 GiB of reclaimable page cache counts as free.
  t.write(dir + "memory.stat",
          "cache 2000\ninactive_file 5\ntotal_inactive_file " + std::to_string(kGiB) + "\n");
  EXPECT_EQ(t.available(), 2 * kGiB);
  // A tighter ancestor wins.
  t.write("cg/memory/box/memory.limit_in_bytes", std::to_string(kGiB + 5) + "\n");
  t.write("cg/memory/box/memory.usage_in_bytes", "5\n");
  EXPECT_EQ(t.available(), kGiB);
}

TEST(CoreMemory, V2LimitCapsMemAvailable) {
  Tree t("mem_v2");
  t.meminfo(20 * 1024 * 1024);
  t.write("proc/self/cgroup", "0::/system.slice/qwenrt.service\n");
  const std::string dir = "cg/system.slice/qwenrt.service/";
  t.write(dir + "memory.max", std::to_string(6 * kGiB) + "\n");
  t.write(dir + "memory.current", std::to_string(kGiB) + "\n");
  t.write(dir + "memory.stat", "anon 100\nfile 200\ninactive_file 0\n");
  EXPECT_EQ(t.available(), 5 * kGiB);
  t.write(dir + "memory.max", "max\n");
  EXPECT_EQ(t.available(), 20 * kGiB);
}

TEST(CoreMemory, ContainerSeesItsCgroupAsTheRoot) {
  // The path in /proc/self/cgroup names a folder outside the container's view of the mount; the
  // limit sits on the mount's root folder.
  Tree t("mem_container");
  t.meminfo(20 * 1024 * 1024);
  t.write("proc/self/cgroup", "0::/../../docker/abc\n");
  t.write("cg/memory.max", std::to_string(3 * kGiB) + "\n");
  t.write("cg/memory.current", std::to_string(kGiB) + "\n");
  EXPECT_EQ(t.available(), 2 * kGiB);
}

TEST(CoreMemory, OverUsedCgroupHasNoRoomAndMissingMeminfoIsUnknown) {
  Tree t("mem_over");
  t.meminfo(20 * 1024 * 1024);
  t.write("proc/self/cgroup", "0::/a\n");
  t.write("cg/a/memory.max", std::to_string(kGiB) + "\n");
  t.write("cg/a/memory.current", std::to_string(2 * kGiB) + "\n");
  EXPECT_EQ(t.available(), 0);
  Tree empty("mem_empty");
  EXPECT_EQ(empty.available(), 0);
}

TEST(CoreMemory, ThisMachineReportsSomething) {
  EXPECT_GT(available_memory(), 0);
}

}  // namespace
}  // namespace qwenrt
