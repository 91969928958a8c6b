// How much memory this process may still take: the kernel's MemAvailable, capped by the limit of
// every memory cgroup it runs under (containers, systemd slices, `docker run --memory`), where
// MemAvailable still shows the whole host.
#pragma once

#include <cstdint>
#include <string>

namespace qwenrt {

// Bytes still available (0 when /proc/meminfo cannot be read).
int64_t available_memory();

// The same over other roots (tests): `proc` holds meminfo and self/cgroup, `cgroup` is the cgroup
// mount (v1: one folder per controller, as memory/; v2: unified at the root or under unified/).
// A cgroup's headroom is its limit less its usage, plus its inactive file pages (page cache the
// kernel reclaims before refusing memory); the cgroup's own folder and each of its ancestors
// count.
int64_t available_memory(const std::string& proc, const std::string& cgroup);

// Drops this process's pages of [p, p + bytes) of a read-only file mapping (the whole pages inside
// it): they leave the resident set, and a later read faults them back in from the file.
void drop_mapped_pages(const void* p, int64_t bytes);

}  // namespace qwenrt
