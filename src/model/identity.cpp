#include "model/identity.h"

#include <array>
#include <cctype>
#include <utility>
#include <vector>

#include "core/log.h"

namespace qwenrt::model {
namespace {

constexpr std::array<std::pair<Checkpoint, const char*>, 4> kRegistry = {{
    {Checkpoint::kQwen36_35B_A3B, "Qwen3.6-35B-A3B"},
    {Checkpoint::kQwen36_27B, "Qwen3.6-27B"},
    {Checkpoint::kQwen38_27B, "Qwen3.8-27B"},
    // Published GGUFs name it "Qwen3.8 Flash Next" (spaces match '-').
    {Checkpoint::kQwen38_FlashNext, "Qwen3.8-Flash-Next"},
}};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// `name` occurs in `text` as a whole: not followed by a letter, digit or '.' (so "Qwen3.6-27B"
// does not match "Qwen3.6-27B0", nor "Qwen3.8-Flash-Next" "...-Nextgen"), case-insensitive, '-' and
// '_' and ' ' treated alike.
bool contains_name(const std::string& text, const std::string& name) {
  auto norm = [](std::string s) {
    s = lower(std::move(s));
    for (auto& c : s) {
      if (c == '_' || c == ' ') c = '-';
    }
    return s;
  };
  const std::string t = norm(text), n = norm(name);
  for (size_t at = t.find(n); at != std::string::npos; at = t.find(n, at + 1)) {
    const size_t end = at + n.size();
    const bool clean_end =
        end == t.size() || !(std::isalnum(static_cast<unsigned char>(t[end])) || t[end] == '.');
    const bool clean_start = at == 0 || !std::isalnum(static_cast<unsigned char>(t[at - 1]));
    if (clean_end && clean_start) return true;
  }
  return false;
}

// Every registered checkpoint whose full name is in `text`.
std::vector<Checkpoint> matches(const std::string& text) {
  std::vector<Checkpoint> found;
  for (const auto& [checkpoint, name] : kRegistry) {
    if (contains_name(text, name)) found.push_back(checkpoint);
  }
  return found;
}

}  // namespace

const char* checkpoint_name(Checkpoint checkpoint) {
  for (const auto& [c, name] : kRegistry) {
    if (c == checkpoint) return name;
  }
  return "other";
}

Identity identify_name(const std::string& general_name, const std::string& file_name) {
  std::string own = general_name.empty() ? file_name : general_name;
  for (const std::string* text : {&general_name, &file_name}) {
    const auto found = matches(*text);
    if (found.size() == 1) return {found[0], checkpoint_name(found[0])};
    // Two names in one (a merge, a comparison): the evidence contradicts itself, so neither
    // checkpoint's defaults are safe to assume.
    if (found.size() > 1) {
      log(LogLevel::kInfo, "model '{}' names both {} and {}; running it under its own name",
          gguf::one_line(*text), checkpoint_name(found[0]), checkpoint_name(found[1]));
      return {Checkpoint::kOther, own};
    }
  }
  log(LogLevel::kInfo, "model '{}' is not a registered checkpoint; running it under its own name",
      gguf::one_line(own));
  return {Checkpoint::kOther, own};
}

Identity identify(const gguf::File& file) {
  std::string base = file.path();
  if (auto slash = base.find_last_of('/'); slash != std::string::npos)
    base = base.substr(slash + 1);
  return identify_name(file.get_string("general.name").value_or(""), base);
}

}  // namespace qwenrt::model
