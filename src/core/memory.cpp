#include "core/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace qwenrt {
namespace {

// The first number of a file ("max" and unreadable files give nothing).
std::optional<int64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  int64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// `key value` lines (meminfo's "MemAvailable: 123 kB", memory.stat's "inactive_file 456").
std::optional<int64_t> read_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string k;
    int64_t v = 0;
    if (fields >> k >> v && k == key) return v;
  }
  return std::nullopt;
}

// "/a/b" -> {"/a/b", "/a", ""}: a cgroup and its ancestors, as paths below the mount.
std::vector<std::string> self_and_ancestors(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (;;) {
    out.push_back(path);
    if (path.empty()) break;
    path = path.substr(0, path.find_last_of('/'));
  }
  return out;
}

// The headroom of one cgroup folder, if it has a limit.
std::optional<int64_t> headroom(const std::string& dir, bool v2) {
  // v1 writes "no limit" as a page-rounded 2^63 - 1.
  constexpr int64_t kNoLimit = int64_t{1} << 62;
  const auto limit = read_number(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
  if (!limit || *limit >= kNoLimit) return std::nullopt;
  const int64_t usage =
      read_number(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")).value_or(0);
  const int64_t inactive =
      read_field(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file").value_or(0);
  return std::max<int64_t>(*limit - usage + inactive, 0);
}

}  // namespace

int64_t available_memory(const std::string& proc, const std::string& cgroup) {
  const auto kib = read_field(proc + "/meminfo", "MemAvailable:");
  if (!kib) return 0;
  int64_t available = *kib * 1024;
  // /proc/self/cgroup: "id:controllers:path", v2's line is "0::path".
  std::ifstream in(proc + "/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::vector<std::pair<std::string, bool>> mounts;  // (mount, is v2)
    if (controllers.empty()) {
      mounts = {{cgroup, true}, {cgroup + "/unified", true}};
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      mounts = {{cgroup + "/memory", false}};
    }
    for (const auto& [mount, v2] : mounts) {
      // Inside a container the path may name a folder the container cannot see; its own view
      // of the mount then is the cgroup (the root folder), which the walk reaches last.
      for (const std::string& dir : self_and_ancestors(path)) {
        if (auto room = headroom(mount + dir, v2)) available = std::min(available, *room);
      }
    }
  }
  return available;
}

int64_t available_memory() {
  return available_memory("/proc", "/sys/fs/cgroup");
}

void drop_mapped_pages(const void* p, int64_t bytes) {
  const uintptr_t page = 4096, begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace qwenrt
