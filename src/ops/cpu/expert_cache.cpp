#include "ops/cpu/expert_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "ops/expert_budget.h"

namespace qwenrt::ops::cpu {
namespace {

constexpr int64_t kAlign = 64;
// Loader threads: reads in flight at once (QWENRT_EXPERT_READERS=1..64 overrides, to measure).
int reader_count() {
  constexpr int kReaders = 4;
  const char* v = std::getenv("QWENRT_EXPERT_READERS");
  const int n = v ? std::atoi(v) : kReaders;
  return n >= 1 && n <= 64 ? n : kReaders;
}

int64_t align_up(int64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

int64_t matrix_bytes(const TensorView& v) {
  return v.ne[1] * v.nb[1];
}

}  // namespace

int64_t expert_slot_bytes(const MoeWeights& w) {
  int64_t bytes = 0;
  for (const Weight* m : routed_matrices(w)) bytes += align_up(matrix_bytes(m->expert_view(0)));
  return bytes;
}

ExpertCache::ExpertCache(const std::vector<MappedPart>& files, int64_t budget_bytes,
                         int64_t slot_bytes, int min_slots, ExpertPolicy policy)
    : slot_bytes_(align_up(slot_bytes)), policy_(policy) {
  const int64_t n = expert_slots_in_budget("expert cache", budget_bytes, slot_bytes_, min_slots);
  for (const MappedPart& f : files) {
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      for (const File& open : files_) ::close(open.fd);
      fail("expert cache: cannot open '{}': {}", f.path, std::strerror(err));
    }
    files_.push_back({f, fd});
  }
  arena_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, static_cast<size_t>(n * slot_bytes_)));
  if (!arena_) fail("expert cache: out of memory for {} bytes", n * slot_bytes_);
  for (int64_t i = 0; i < n; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->mem = arena_ + i * slot_bytes_;
  }
  // Several reads in flight: one pread at a time drew ~510 MB/s from the virtual disk here, four
  // ~670 MB/s, where llama.cpp's page faults (with read-ahead) drew ~1.1 GB/s
  // (bench/results/cpu-expert-stream-vs-llamacpp.md).
  for (int r = reader_count(); r > 0; --r) readers_.emplace_back([this] { loader(); });
}

ExpertCache::~ExpertCache() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  queued_.notify_all();
  for (auto& t : readers_) t.join();
  std::free(arena_);
  for (const File& f : files_) ::close(f.fd);
}

std::pair<int, int64_t> ExpertCache::locate(const void* data, int64_t bytes, int e,
                                            const std::string& name) const {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < files_.size(); ++i) {
    const MappedPart& m = files_[i].mapped;
    if (p >= m.base && p - m.base + bytes <= static_cast<int64_t>(m.size))
      return {static_cast<int>(i), p - m.base};
  }
  fail("expert cache: expert {} of '{}' ({} bytes) lies in none of the model's files", e, name,
       bytes);
}

int ExpertCache::place(const MoeWeights& w, int e, bool* hit) {
  const Key key{w.down_exps.view.data, e};
  ++clock_;
  if (auto it = index_.find(key); it != index_.end()) {
    *hit = true;
    return it->second;
  }
  *hit = false;
  // A victim: free first, else the least recently (LRU) or least often (LFU) used idle slot.
  int victim = -1;
  for (int i = 0; i < capacity(); ++i) {
    const Slot& s = *slots_[i];
    if (s.pins > 0 || s.loading) continue;
    if (s.key.second < 0) {
      victim = i;
      break;
    }
    if (victim < 0) {
      victim = i;
      continue;
    }
    const Slot& v = *slots_[victim];
    const bool better = policy_ == ExpertPolicy::kLru
                            ? s.last_use < v.last_use
                            : (s.uses < v.uses || (s.uses == v.uses && s.last_use < v.last_use));
    if (better) victim = i;
  }
  if (victim < 0) return -1;
  Slot& s = *slots_[victim];
  if (s.key.second >= 0) index_.erase(s.key);
  s.key = key;
  s.uses = 0;
  s.prefetched = false;
  s.ready.store(false, std::memory_order_relaxed);
  s.loading = true;
  s.parts.clear();
  int64_t at = 0;
  for (const Weight* m : routed_matrices(w)) {
    const TensorView v = m->expert_view(e);
    const int64_t bytes = matrix_bytes(v);
    const auto [file, offset] = locate(v.data, bytes, e, m->name);
    s.parts.push_back({.file = file, .offset = offset, .bytes = bytes, .at = at});
    at += align_up(bytes);
  }
  if (at > slot_bytes_)
    fail("expert cache: expert {} of '{}' takes {} bytes, slots hold {}", e, w.down_exps.name, at,
         slot_bytes_);
  index_[key] = victim;
  queue_.push_back(victim);
  queued_.notify_one();
  return victim;
}

ExpertCache::Entry ExpertCache::pin(const MoeWeights& w, int e) {
  std::unique_lock lock(mu_);
  bool hit = false;
  int i;
  // Slots still loading (prefetches) free up as their reads end; pinned ones only with unpin.
  while ((i = place(w, e, &hit)) < 0) {
    bool loading = false;
    for (const auto& slot : slots_) loading = loading || (slot->loading && slot->pins == 0);
    if (!loading) fail("expert cache: all {} slots are pinned", capacity());
    loaded_.wait(lock);
  }
  Slot& s = *slots_[i];
  ++stats_.lookups;
  if (hit) {
    ++stats_.hits;
    if (s.prefetched) ++stats_.prefetch_hits;
  }
  s.prefetched = false;
  ++s.pins;
  ++s.uses;
  s.last_use = clock_;
  Entry entry{.slot = i};
  const auto matrices = routed_matrices(w);
  for (size_t m = 0; m < matrices.size(); ++m) {
    TensorView v = matrices[m]->expert_view(e);
    v.data = s.mem + s.parts[m].at;
    if (matrices[m] == &w.gate_up_exps) entry.gate_up = v;
    if (matrices[m] == &w.gate_exps) entry.gate = v;
    if (matrices[m] == &w.up_exps) entry.up = v;
    if (matrices[m] == &w.down_exps) entry.down = v;
  }
  return entry;
}

void ExpertCache::wait(int slot) {
  if (!ready(slot)) {
    std::unique_lock lock(mu_);
    loaded_.wait(lock, [&] { return ready(slot); });
  }
  if (failed_.load(std::memory_order_acquire)) {  // the common path takes no lock
    std::lock_guard lock(mu_);
    fail("{}", error_);
  }
}

void ExpertCache::unpin(int slot) {
  std::lock_guard lock(mu_);
  if (slots_[slot]->pins <= 0) fail("expert cache: slot {} is not pinned", slot);
  --slots_[slot]->pins;
}

void ExpertCache::prefetch(const MoeWeights& w, int e) {
  std::lock_guard lock(mu_);
  bool hit = false;
  const int i = place(w, e, &hit);
  if (i >= 0 && !hit) slots_[i]->prefetched = true;
}

ExpertCacheStats ExpertCache::stats() const {
  std::lock_guard lock(mu_);
  ExpertCacheStats s = stats_;
  s.capacity = capacity();
  return s;
}

void ExpertCache::loader() {
  for (;;) {
    int i;
    std::vector<Read> parts;
    {
      std::unique_lock lock(mu_);
      queued_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      i = queue_.front();
      queue_.pop_front();
      parts = slots_[i]->parts;
    }
    Slot& s = *slots_[i];
    int64_t bytes = 0;
    for (const auto& [file, offset, size, at] : parts) {
      const int fd = files_[file].fd;
      for (int64_t done = 0; done < size;) {
        const ssize_t r = ::pread(fd, s.mem + at + done, static_cast<size_t>(size - done),
                                  static_cast<off_t>(offset + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {  // the waiting MoE op reports it
          std::lock_guard lock(mu_);
          error_ =
              fmt::format("expert cache: reading {} bytes at offset {} of '{}': {}", size, offset,
                          files_[file].mapped.path, r < 0 ? std::strerror(errno) : "end of file");
          failed_.store(true, std::memory_order_release);
          break;
        }
        done += r;
      }
      // The slot holds the bytes now: the page cache's copy would only double them.
      ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(size),
                      POSIX_FADV_DONTNEED);
      bytes += size;
    }
    {
      std::lock_guard lock(mu_);
      s.loading = false;
      s.ready.store(true, std::memory_order_release);
      ++stats_.loads;
      stats_.bytes_read += bytes;
    }
    loaded_.notify_all();
  }
}

}  // namespace qwenrt::ops::cpu
