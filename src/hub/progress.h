// The download progress line: bar, percent, bytes, speed and time left.
#pragma once

#include <cstdint>
#include <string>

#include "hub/http.h"

namespace qwenrt::hub {

// "Qwen3.6-27B-Q4_K_M.gguf [#######.............] 35% 6.70/19.10 GB 112.4 MB/s ETA 1m50s"
// (speed over this run's bytes only, so a resumed download does not look fast).
std::string format_progress(const Progress& p, int bar_width = 30);

// "19.10 GiB", "6.1 MiB", "512 B": sizes in messages and listings.
std::string human_size(uint64_t bytes);

// Redraws the line on stderr when it is a terminal; otherwise prints one line when done.
ProgressFn stderr_progress();

}  // namespace qwenrt::hub
