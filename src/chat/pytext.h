// Python's text forms of JSON values, as a chat template running under HF transformers writes them.
//
// The official template writes tool definitions and tool-call arguments with `tojson` and
// `|string`; transformers replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False)`, and
// `|string` is Python's `str()`. A rendered prompt must match those bytes exactly, so they are
// reproduced here rather than left to nlohmann's `dump()` (whose separators, float format and
// escapes all differ).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace qwenrt::chat {

// Key order matters (json.dumps keeps insertion order), so the chat module works on ordered_json.
using Json = nlohmann::ordered_json;

// json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in their given order,
// non-ASCII text as is, control characters as \u00xx, floats as Python's repr().
std::string py_json_dumps(const Json& value);

// str(value) for a JSON scalar: a string as is, True/False/None, an int in decimal, a float as
// repr(). Objects and arrays are not scalars here (the template writes those with tojson).
std::string py_str(const Json& value);

// repr(float): the shortest text that reads back the same double, in Python's layout
// ("1.0", "1e+16", "1e-05", "0.0001", "-0.0", "inf", "nan").
std::string py_float_repr(double value);

// str.strip(): removes leading and trailing characters for which Python's str.isspace() holds
// (ASCII whitespace, U+001C..U+001F, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
// U+202F, U+205F, U+3000), reading the text as UTF-8. Jinja's `|trim` is this.
std::string_view py_strip(std::string_view text);

}  // namespace qwenrt::chat
