// What every dialect's request reading shares: the error a bad request becomes (HTTP status, the
// field it names), reading the JSON body, and typed, range-checked field access. Each dialect
// (openai.cpp, anthropic.cpp) writes ApiError in its own JSON shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/pytext.h"
#include "chat/render.h"
#include "core/error.h"
#include "model/identity.h"

namespace qwenrt::serve {

using chat::Json;

// A request the server refuses: status (400, 401, 404, 413, 429, 503 ...), the message (naming the
// field and what was wrong with it), the field's path ("messages[2].role"; empty when none).
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : Error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// 400 naming `param`: "PARAM: MESSAGE".
template <class... Args>
[[noreturn]] void bad_field(const std::string& param, fmt::format_string<Args...> format,
                            Args&&... args) {
  throw ApiError(400, param + ": " + fmt::format(format, std::forward<Args>(args)...), param);
}

// What the request reading needs to know about the model being served.
struct ModelInfo {
  std::string name;  // the id /v1/models lists and replies carry
  chat::Dialect dialect = chat::Dialect::kQwen35;
  model::Checkpoint checkpoint{};
  int64_t n_ctx = 0;    // tokens per sequence
  int32_t n_vocab = 0;  // logit_bias ids must be below this
  Json defaults;        // the identity and the defaults in force (gen::to_json), for /v1/models
};

// The body as a JSON object (400 on malformed JSON, invalid UTF-8, or another top-level type).
Json parse_json_body(std::string_view body);

// The JSON type's name as an error message says it ("a string", "an array", ...).
std::string json_type_name(const Json& value);

// Typed access to an optional field of `object` at `path` ("messages[0]"): nullopt when absent or
// null; 400 naming the field when of the wrong type or out of range.
std::optional<std::string> opt_string(const Json& object, const std::string& key,
                                      const std::string& path = {});
std::optional<bool> opt_bool(const Json& object, const std::string& key,
                             const std::string& path = {});
// A finite number within [lo, hi].
std::optional<double> opt_number(const Json& object, const std::string& key, double lo, double hi,
                                 const std::string& path = {});
// An integer within [lo, hi] (a float with an integral value counts; 1.5 does not).
std::optional<int64_t> opt_integer(const Json& object, const std::string& key, int64_t lo,
                                   int64_t hi, const std::string& path = {});
// "a" or "a.b" or "a[1]".
std::string field_path(const std::string& path, const std::string& key);
// A field that must be present and not null (400 "required" naming it otherwise), and the same
// for a string field.
const Json& required(const Json& object, const std::string& key, const std::string& path);
std::string required_string(const Json& object, const std::string& key, const std::string& path);

// stop: a string or an array of non-empty strings (at most `max`).
std::vector<std::string> read_stop(const Json& value, const std::string& param, size_t max = 16);

// "path[i]".
std::string index_path(const std::string& path, size_t i);
// 400 naming `path` unless `value` is an object.
void require_object(const Json& value, const std::string& path);
// A function tool's name and JSON schema, as every dialect's tools carry them: the name is written
// into the prompt as <function=NAME> (1 to 64 of a-z A-Z 0-9 _ - .); the schema, when not null, is
// an object of type "object" whose properties are objects and whose required is a string array.
void check_tool_name(const std::string& name, const std::string& path);
void check_tool_schema(const Json& schema, const std::string& path);

// Rejects a request whose rendered prompt does not leave room for one generated token.
void check_prompt_fits(size_t n_prompt, int64_t n_ctx, const std::string& param);

// A random identifier: prefix + n letters and digits ("chatcmpl-", "call_", "msg_").
std::string random_id(std::string_view prefix, size_t n = 24);

// nlohmann's dump, never throwing on bytes that are not UTF-8 (a token's text may be half a
// character): those are replaced by U+FFFD.
std::string dump_json(const Json& value);

}  // namespace qwenrt::serve
