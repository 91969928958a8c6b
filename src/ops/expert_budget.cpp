#include "ops/expert_budget.h"

#include "core/error.h"

namespace qwenrt::ops {

int64_t expert_slots_in_budget(std::string_view who, int64_t budget_bytes, int64_t slot_bytes,
                               int min_slots) {
  if (slot_bytes <= 0) fail("{}: slots of {} bytes", who, slot_bytes);
  const int64_t n = budget_bytes / slot_bytes;
  if (n < min_slots) {
    fail("{}: {:.1f} MiB holds {} experts of {:.2f} MiB; one token needs {} (at least {:.1f} MiB)",
         who, budget_bytes / 1048576.0, n, slot_bytes / 1048576.0, min_slots,
         static_cast<double>(min_slots) * slot_bytes / 1048576.0);
  }
  return n;
}

}  // namespace qwenrt::ops
