#include "chat/pytext.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"

namespace qwenrt::chat {
namespace {

void append_json_string(std::string& out, std::string_view text) {
  // Python's json escapes exactly these with ensure_ascii=False; everything else (DEL, non-ASCII,
  // U+2028) is written raw.
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out.push_back(kHex[byte >> 4]);
          out.push_back(kHex[byte & 15]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void append_json(std::string& out, const Json& value) {
  switch (value.type()) {
    case Json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, key);
        out += ": ";
        append_json(out, item);
      }
      out.push_back('}');
      return;
    }
    case Json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        append_json(out, item);
      }
      out.push_back(']');
      return;
    }
    case Json::value_t::string:
      append_json_string(out, value.get_ref<const std::string&>());
      return;
    case Json::value_t::boolean:
      out += value.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::null:
      out += "null";
      return;
    case Json::value_t::number_float: {
      const double number = value.get<double>();
      // json.dumps writes the non-finite floats as JavaScript names.
      if (std::isnan(number)) {
        out += "NaN";
      } else if (std::isinf(number)) {
        out += number < 0 ? "-Infinity" : "Infinity";
      } else {
        out += py_float_repr(number);
      }
      return;
    }
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::binary:
    case Json::value_t::discarded:
      out += py_str(value);
      return;
  }
}

// Decodes the code point starting at text[pos] (length in *size); -1 for a malformed sequence.
int32_t decode_utf8(std::string_view text, size_t pos, size_t* size) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  size_t length = 0;
  int32_t code = 0;
  if (lead < 0x80) {
    *size = 1;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code = lead & 0x07;
  } else {
    *size = 1;
    return -1;
  }
  if (pos + length > text.size()) {
    *size = 1;
    return -1;
  }
  for (size_t i = 1; i < length; ++i) {
    const auto next = static_cast<unsigned char>(text[pos + i]);
    if ((next & 0xC0) != 0x80) {
      *size = 1;
      return -1;
    }
    code = (code << 6) | (next & 0x3F);
  }
  *size = length;
  return code;
}

bool py_isspace(int32_t code) {
  return (code >= 0x09 && code <= 0x0D) || (code >= 0x1C && code <= 0x20) || code == 0x85 ||
         code == 0xA0 || code == 0x1680 || (code >= 0x2000 && code <= 0x200A) || code == 0x2028 ||
         code == 0x2029 || code == 0x202F || code == 0x205F || code == 0x3000;
}

}  // namespace

std::string py_json_dumps(const Json& value) {
  std::string out;
  append_json(out, value);
  return out;
}

std::string py_str(const Json& value) {
  switch (value.type()) {
    case Json::value_t::string:
      return value.get<std::string>();
    case Json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case Json::value_t::null:
      return "None";
    case Json::value_t::number_integer:
      return std::to_string(value.get<int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(value.get<uint64_t>());
    case Json::value_t::number_float:
      return py_float_repr(value.get<double>());
    case Json::value_t::object:
    case Json::value_t::array:
    case Json::value_t::binary:
    case Json::value_t::discarded:
      break;
  }
  fail("chat: cannot write a JSON {} as a template string", value.type_name());
}

std::string py_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, as Python's repr picks them; only the layout differs.
  char buffer[64];
  const auto [end, error] =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  if (error != std::errc()) fail("chat: cannot format the float {}", value);
  const std::string_view text(buffer, static_cast<size_t>(end - buffer));
  // text is "[-]d[.ddd]e(+|-)XX".
  const size_t e_pos = text.find('e');
  std::string_view mantissa = text.substr(0, e_pos);
  const int exponent = std::atoi(std::string(text.substr(e_pos + 1)).c_str());
  std::string sign;
  if (!mantissa.empty() && mantissa[0] == '-') {
    sign = "-";
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  const int n_digits = static_cast<int>(digits.size());
  // decpt: where the decimal point falls relative to the digits (value = 0.DIGITS * 10^decpt).
  // Python uses exponent notation when decpt <= -4 or decpt > 16 (float_repr_style "short").
  const int decpt = exponent + 1;
  std::string out = sign;
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n_digits > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    const int e = decpt - 1;
    out.push_back('e');
    out.push_back(e < 0 ? '-' : '+');
    const std::string magnitude = std::to_string(std::abs(e));
    if (magnitude.size() < 2) out.push_back('0');
    out += magnitude;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n_digits) {
    out += digits;
    out.append(static_cast<size_t>(decpt - n_digits), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out.push_back('.');
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string_view py_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t size = 0;
    const int32_t code = decode_utf8(text, begin, &size);
    if (!py_isspace(code)) break;
    begin += size;
  }
  size_t end = text.size();
  while (end > begin) {
    // Step back to the start of the last code point (over at most three continuation bytes).
    size_t start = end - 1;
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    size_t size = 0;
    const int32_t code = decode_utf8(text, start, &size);
    if (start + size != end || !py_isspace(code)) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

}  // namespace qwenrt::chat
