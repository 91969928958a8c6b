// Test support: a hub::Env (the environment the hub reads) from a map; an empty value is unset.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "hub/env.h"

namespace qwenrt::testing_support {

inline hub::Env env_of(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

}  // namespace qwenrt::testing_support
