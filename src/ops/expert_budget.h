// The slots an expert cache's budget holds (the cpu backend's ExpertCache, the cuda backend's
// device pool).
#pragma once

#include <cstdint>
#include <string_view>

namespace qwenrt::ops {

// budget_bytes / slot_bytes; Error naming `who` and the sizes where that is below min_slots
// (the experts one token picks in a layer).
int64_t expert_slots_in_budget(std::string_view who, int64_t budget_bytes, int64_t slot_bytes,
                               int min_slots);

}  // namespace qwenrt::ops
