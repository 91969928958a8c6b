// Names of general.file_type values (llama.cpp's llama_ftype), for display.
#pragma once

#include <cstdint>
#include <string>

namespace qwenrt::gguf {

// "Q4_K_M", or "unknown (N)".
std::string file_type_name(uint64_t file_type);

}  // namespace qwenrt::gguf
