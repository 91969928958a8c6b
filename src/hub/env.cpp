#include "hub/env.h"

#include <cctype>
#include <cstdlib>

namespace qwenrt::hub {

Env process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

bool env_flag(const Env& env, std::string_view name) {
  auto value = env(name);
  if (!value) return false;
  std::string upper;
  for (char c : *value) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper == "1" || upper == "ON" || upper == "YES" || upper == "TRUE";
}

}  // namespace qwenrt::hub
