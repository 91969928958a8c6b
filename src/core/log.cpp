#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace qwenrt {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("QWENRT_LOG");
  if (v == nullptr) return LogLevel::kWarn;
  std::string s(v);
  if (s == "error") return LogLevel::kError;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  return LogLevel::kWarn;
}

std::atomic<LogLevel>& current_level() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() {
  return current_level().load(std::memory_order_relaxed);
}
void set_log_level(LogLevel level) {
  current_level().store(level);
}

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "qwenrt %s: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace qwenrt
