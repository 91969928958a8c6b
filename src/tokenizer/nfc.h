// Unicode Normalization Form C, as HF tokenizers applies it (Unicode 9.0 data; nfc_tables.h).
#pragma once

#include <string>
#include <string_view>

namespace qwenrt::tokenizer {

// `text` must be valid UTF-8. Returns `text` itself when it is already NFC (the common case,
// decided by a quick check without copying), else the normalised text, built in `storage`.
std::string_view normalize_nfc(std::string_view text, std::string& storage);

}  // namespace qwenrt::tokenizer
