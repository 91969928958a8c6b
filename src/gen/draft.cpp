#include "gen/draft.h"

#include <algorithm>

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
  return rows >= 1 && rows <= kMaxRows && by_rows_[rows].steps > kWarmupSteps;
}

void DraftCostModel::record_step(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds >= 0)) return;
  Cost& c = by_rows_[rows];
  if (c.steps >= kWarmupSteps) c.seconds = average(c.seconds, c.steps - kWarmupSteps, seconds);
  ++c.steps;
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
