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

}  // namespace qwenrt::gen
