#include "gen/draft.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

namespace qwenrt::gen {

const char* draft_kind_name(DraftKind kind) {
  switch (kind) {
    case DraftKind::kNgram:
      return "ngram";
    case DraftKind::kMtp:
      return "mtp";
    case DraftKind::kNone:
      break;
  }
  return "none";
}

void draft_ngram(std::span<const int32_t> prompt, std::span<const int32_t> generated, int min_n,
                 int max_n, int max, std::vector<int32_t>& out) {
  out.clear();
  const int64_t np = static_cast<int64_t>(prompt.size());
  const int64_t len = np + static_cast<int64_t>(generated.size());
  auto at = [&](int64_t i) { return i < np ? prompt[i] : generated[i - np]; };
  if (max <= 0 || min_n < 1) return;
  for (int n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    // The most recent earlier start s < len - n whose n tokens equal the text's last n.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      bool match = true;
      for (int i = 0; i < n && match; ++i) match = at(s + i) == at(len - n + i);
      if (!match) continue;
      for (int64_t i = s + n; i < len && static_cast<int>(out.size()) < max; ++i)
        out.push_back(at(i));
      return;
    }
  }
}

int DraftController::depth() {
  if (max_ <= 0) return 0;
  if (paused_ > 0) {
    --paused_;
    return 0;
  }
  return depth_;
}

void DraftController::record(int drafted, int accepted) {
  if (drafted <= 0) return;
  held_ = kDecay * held_ + accepted;
  tested_ = kDecay * tested_ + std::min(accepted + 1, drafted);
  if (accepted == drafted) {
    depth_ = std::min(max_, depth_ + 1);
  } else {
    depth_ = std::clamp(accepted + 1, 1, max_);
  }
  if (accepted == 0) {
    if (++misses_ >= kMissesToPause) {
      misses_ = 0;
      paused_ = kPauseSteps;
    }
  } else {
    misses_ = 0;
  }
}

namespace {
constexpr double kAverage = 0.8;  // a moving average's weight on what came before
double average(double avg, int n, double x) {
  return n == 0 ? x : kAverage * avg + (1 - kAverage) * x;
}
}  // namespace

bool DraftCostModel::measured(int64_t rows) const {
  return rows >= 1 && rows <= kMaxRows && by_rows_[rows].samples > 0;
}

bool DraftCostModel::any_measured() const {
  for (int64_t r = 1; r <= kMaxRows; ++r)
    if (measured(r)) return true;
  return draft_samples_ > 0;
}

void DraftCostModel::record_step(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds >= 0)) return;
  Cost& c = by_rows_[rows];
  if (c.seen++ < kWarmupSteps) return;
  c.seconds = average(c.seconds, c.samples++, seconds);
}

namespace {
constexpr std::string_view kCostsHeader = "qwenrt step costs 1";
}  // namespace

std::string DraftCostModel::save(const std::string& key) const {
  std::string out = fmt::format("{}\nkey {}\ndraft {:.9g} {}\n", kCostsHeader, key, draft_seconds_,
                                draft_samples_);
  for (int64_t r = 1; r <= kMaxRows; ++r) {
    if (measured(r))
      out += fmt::format("rows {} {:.9g} {}\n", r, by_rows_[r].seconds, by_rows_[r].samples);
  }
  return out;
}

bool DraftCostModel::restore(std::string_view text, const std::string& key, std::string* why) {
  auto fail = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  std::istringstream in{std::string(text)};
  std::string line;
  if (!std::getline(in, line) || line != kCostsHeader) return fail("not a step-costs file");
  if (!std::getline(in, line) || line != "key " + key) return fail("measured on another setup");
  DraftCostModel m;
  bool draft_seen = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string word;
    ls >> word;
    if (word == "draft" && !draft_seen) {
      double seconds = -1;
      int samples = -1;
      if (!(ls >> seconds >> samples) || !std::isfinite(seconds) || seconds < 0 || samples < 0)
        return fail(fmt::format("a bad line: {}", line));
      m.draft_seconds_ = seconds;
      m.draft_samples_ = samples;
      draft_seen = true;
    } else if (word == "rows") {
      int64_t rows = 0;
      double seconds = -1;
      int samples = 0;
      if (!(ls >> rows >> seconds >> samples) || rows < 1 || rows > kMaxRows ||
          !std::isfinite(seconds) || seconds <= 0 || samples < 1 || m.measured(rows))
        return fail(fmt::format("a bad line: {}", line));
      m.by_rows_[rows].seconds = seconds;
      m.by_rows_[rows].samples = samples;
    } else {
      return fail(fmt::format("a bad line: {}", line));
    }
    std::string rest;
    if (ls >> rest) return fail(fmt::format("a bad line: {}", line));
  }
  if (!draft_seen) return fail("no drafter line");
  for (int64_t r = 1; r <= kMaxRows; ++r) m.by_rows_[r].seen = by_rows_[r].seen;
  *this = m;
  return true;
}

void DraftCostModel::record_drafting(int64_t drafts, double seconds) {
  if (drafts <= 0 || !(seconds >= 0)) return;
  draft_seconds_ = average(draft_seconds_, draft_samples_++, seconds / static_cast<double>(drafts));
}

double DraftCostModel::cost(int64_t rows) const {
  if (rows < 1 || rows > kMaxRows) return -1;
  if (measured(rows)) return by_rows_[rows].seconds;
  // The measured row counts nearest below and above (a second one below when none is above).
  int64_t lo = -1, lo2 = -1, hi = -1;
  for (int64_t r = rows - 1; r >= 1 && lo2 < 0; --r) {
    if (!measured(r)) continue;
    (lo < 0 ? lo : lo2) = r;
  }
  for (int64_t r = rows + 1; r <= kMaxRows && hi < 0; ++r) {
    if (measured(r)) hi = r;
  }
  auto line = [&](int64_t a, int64_t b) {  // through the costs at a and b, at rows
    const double ca = by_rows_[a].seconds, cb = by_rows_[b].seconds;
    return ca + (cb - ca) * static_cast<double>(rows - a) / static_cast<double>(b - a);
  };
  if (lo > 0 && hi > 0) return line(lo, hi);
  if (lo > 0 && lo2 > 0) return std::max(by_rows_[lo].seconds, line(lo2, lo));
  return -1;
}

int DraftCostModel::depth(int max_depth, double acceptance, int64_t other_rows,
                          bool may_explore) const {
  const int64_t plain_rows = other_rows + 1;
  const double plain = cost(plain_rows);
  if (max_depth <= 0 || plain <= 0 || !measured(plain_rows)) return 0;  // measure plain first
  const double a = std::clamp(acceptance, 0.0, 1.0);
  const double plain_rate = static_cast<double>(plain_rows) / plain;
  int best = 0;
  double best_rate = plain_rate * (1 + kMargin);
  double yield = 1, power = 1;  // E(j) and a^j
  for (int j = 1; j <= max_depth && plain_rows + j <= kMaxRows; ++j) {
    power *= a;
    yield += power;
    const double c = cost(plain_rows + j);
    if (c <= 0) return best > 0 || !may_explore ? best : j;  // not estimable yet: measure it
    const double rate =
        (static_cast<double>(other_rows) + yield) / (c + static_cast<double>(j) * draft_seconds_);
    if (rate > best_rate) {
      best = j;
      best_rate = rate;
    }
  }
  return best;
}

}  // namespace qwenrt::gen
