#include "serve/fields.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace qwenrt::serve {

Json parse_json_body(std::string_view body) {
  Json value;
  try {
    value = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {
    // nlohmann's lexer also rejects strings that are not valid UTF-8 here, and numbers too large
    // for a double (1e999) as out_of_range.
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!value.is_object())
    throw ApiError(400, "the request body must be a JSON object, got " + json_type_name(value));
  return value;
}

std::string json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

std::string field_path(const std::string& path, const std::string& key) {
  if (path.empty()) return key;
  if (!key.empty() && key[0] == '[') return path + key;
  return path + "." + key;
}

namespace {
const Json* get(const Json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

std::optional<std::string> opt_string(const Json& object, const std::string& key,
                                      const std::string& path) {
  const Json* v = get(object, key);
  if (!v) return std::nullopt;
  if (!v->is_string())
    bad_field(field_path(path, key), "expected a string, got {}", json_type_name(*v));
  return v->get<std::string>();
}

std::optional<bool> opt_bool(const Json& object, const std::string& key, const std::string& path) {
  const Json* v = get(object, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    bad_field(field_path(path, key), "expected a boolean, got {}", json_type_name(*v));
  return v->get<bool>();
}

std::optional<double> opt_number(const Json& object, const std::string& key, double lo, double hi,
                                 const std::string& path) {
  const Json* v = get(object, key);
  if (!v) return std::nullopt;
  const std::string p = field_path(path, key);
  if (!v->is_number()) bad_field(p, "expected a number, got {}", json_type_name(*v));
  const double x = v->get<double>();
  // JSON has no NaN, but 1e999 reads as infinity.
  if (!std::isfinite(x)) bad_field(p, "expected a finite number");
  if (x < lo || x > hi) bad_field(p, "{} is out of range [{}, {}]", x, lo, hi);
  return x;
}

std::optional<int64_t> opt_integer(const Json& object, const std::string& key, int64_t lo,
                                   int64_t hi, const std::string& path) {
  const Json* v = get(object, key);
  if (!v) return std::nullopt;
  const std::string p = field_path(path, key);
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) bad_field(p, "{} is out of range [{}, {}]", u, lo, hi);
    return static_cast<int64_t>(u);
  }
  int64_t x = 0;
  if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) bad_field(p, "expected an integer, got {}", d);
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
      bad_field(p, "{} is out of range [{}, {}]", d, lo, hi);
    x = static_cast<int64_t>(d);
  } else {
    bad_field(p, "expected an integer, got {}", json_type_name(*v));
  }
  if (x < lo || x > hi) bad_field(p, "{} is out of range [{}, {}]", x, lo, hi);
  return x;
}

std::vector<std::string> read_stop(const Json& value, const std::string& param, size_t max) {
  std::vector<std::string> stop;
  if (value.is_null()) return stop;
  if (value.is_string()) {
    if (value.get_ref<const std::string&>().empty()) bad_field(param, "empty stop string");
    stop.push_back(value.get<std::string>());
    return stop;
  }
  if (!value.is_array())
    bad_field(param, "expected a string or an array of strings, got {}", json_type_name(value));
  if (value.size() > max) bad_field(param, "at most {} stop strings, got {}", max, value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!value[i].is_string()) bad_field(p, "expected a string, got {}", json_type_name(value[i]));
    if (value[i].get_ref<const std::string&>().empty()) bad_field(p, "empty stop string");
    stop.push_back(value[i].get<std::string>());
  }
  return stop;
}

std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

const Json& required(const Json& object, const std::string& key, const std::string& path) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) bad_field(field_path(path, key), "required");
  return *it;
}

std::string required_string(const Json& object, const std::string& key, const std::string& path) {
  required(object, key, path);
  return *opt_string(object, key, path);
}

void require_object(const Json& value, const std::string& path) {
  if (!value.is_object()) bad_field(path, "expected an object, got {}", json_type_name(value));
}

void check_tool_name(const std::string& name, const std::string& path) {
  const bool ok =
      !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-' || c == '.';
      });
  if (!ok) bad_field(path, "'{}' is not a valid name (1 to 64 of a-z A-Z 0-9 _ - .)", name);
}

void check_tool_schema(const Json& schema, const std::string& path) {
  if (schema.is_null()) return;
  require_object(schema, path);
  if (auto type = opt_string(schema, "type", path); type && *type != "object")
    bad_field(field_path(path, "type"), "expected 'object', got '{}'", *type);
  if (schema.contains("properties") && !schema["properties"].is_null()) {
    const std::string pp = field_path(path, "properties");
    require_object(schema["properties"], pp);
    for (const auto& [key, prop] : schema["properties"].items())
      require_object(prop, field_path(pp, key));
  }
  if (schema.contains("required") && !schema["required"].is_null()) {
    const std::string rp = field_path(path, "required");
    const Json& req = schema["required"];
    if (!req.is_array()) bad_field(rp, "expected an array, got {}", json_type_name(req));
    for (size_t k = 0; k < req.size(); ++k)
      if (!req[k].is_string()) bad_field(index_path(rp, k), "expected a string");
  }
}

void check_prompt_fits(size_t n_prompt, int64_t n_ctx, const std::string& param) {
  if (n_prompt == 0) bad_field(param, "the prompt is empty");
  if (static_cast<int64_t>(n_prompt) >= n_ctx)
    throw ApiError(400,
                   fmt::format("{}: the prompt is {} tokens; the context holds {} (prompt and "
                               "reply together)",
                               param, n_prompt, n_ctx),
                   param, "context_length_exceeded");
}

std::string random_id(std::string_view prefix, size_t n) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(prefix);
  for (size_t i = 0; i < n; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
  return id;
}

std::string dump_json(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace qwenrt::serve
