// The environment the hub reads (HF_HOME, HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT,
// ...), behind a function so tests can hand in their own instead of changing the process's.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace qwenrt::hub {

// Returns the variable's value; nullopt when it is unset. An empty value counts as unset, as
// huggingface_hub treats `HF_HOME=` (os.getenv gives "" and its path joins then fail over).
using Env = std::function<std::optional<std::string>(std::string_view name)>;

Env process_env();

// huggingface_hub's truthy values for flags such as HF_HUB_OFFLINE: 1, ON, YES, TRUE (any case).
bool env_flag(const Env& env, std::string_view name);

}  // namespace qwenrt::hub
