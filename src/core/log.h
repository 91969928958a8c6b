// Leveled logging to stderr. The level comes from QWENRT_LOG (error|warn|info|debug), default warn.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace qwenrt {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level <= log_level()) log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qwenrt
