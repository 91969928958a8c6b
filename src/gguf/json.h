// JSON forms of GGUF metadata and tensor tables (for `qwenrt info --json` and harnesses).
#pragma once

#include <nlohmann/json.hpp>

#include "gguf/reader.h"

namespace qwenrt::gguf {

// Numbers, strings, bools; arrays as lists, complete (never summarised).
nlohmann::json to_json(const Value& value);
// {"version", "alignment", "data_offset", "metadata": [{"key","type","value"}...],
//  "tensors": [{"name","type","shape","offset","n_bytes"}...]}
nlohmann::json to_json(const File& file);

}  // namespace qwenrt::gguf
