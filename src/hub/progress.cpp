#include "hub/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qwenrt::hub {
namespace {

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string label_of(const std::string& label) {
  // The file name is what a person reads; repos are in the notice line before.
  const size_t slash = label.find_last_of("/:");
  std::string name = slash == std::string::npos ? label : label.substr(slash + 1);
  if (const size_t paren = name.find(')'); paren != std::string::npos) name.resize(paren);
  return name;
}

}  // namespace

std::string human_size(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.1f} MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.1f} KiB", n / double(1ull << 10));
  return fmt::format("{} B", n);
}

std::string format_progress(const Progress& p, int bar_width) {
  const double frac = p.total == 0 ? 1.0 : std::min(1.0, double(p.done) / double(p.total));
  const int filled = static_cast<int>(frac * bar_width);
  const double speed = p.seconds > 0 ? double(p.done - p.resumed) / p.seconds : 0.0;
  const std::string tail =
      p.finished
          ? fmt::format("in {}", duration(p.seconds))
          : fmt::format("ETA {}", speed > 0 ? duration(double(p.total - p.done) / speed) : "?");
  // Units from the total, so a small file does not read 0.01/0.01 GB.
  const bool gb = p.total >= 1'000'000'000;
  const double unit = gb ? 1e9 : 1e6;
  return fmt::format("{} [{}{}] {:3d}% {:.2f}/{:.2f} {} {:.1f} MB/s {}", label_of(p.label),
                     std::string(filled, '#'), std::string(bar_width - filled, '.'),
                     static_cast<int>(frac * 100), p.done / unit, p.total / unit, gb ? "GB" : "MB",
                     speed / 1e6, tail);
}

ProgressFn stderr_progress() {
  const bool tty = isatty(STDERR_FILENO) != 0;
  return [tty](const Progress& p) {
    if (p.failed) {
      if (tty) fmt::print(stderr, "\n");  // keep the line where it stopped; the error follows
    } else if (tty) {
      fmt::print(stderr, "\r{}\x1b[K{}", format_progress(p), p.finished ? "\n" : "");
    } else if (p.finished) {
      fmt::print(stderr, "{}\n", format_progress(p));
    }
    std::fflush(stderr);
  };
}

}  // namespace qwenrt::hub
