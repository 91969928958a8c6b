#include "core/dtype.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace qwenrt {
namespace {

struct Entry {
  DType type;
  DTypeTraits traits;
};

constexpr uint32_t QK_K = 256;

// Block geometry as in ggml's type table.
constexpr std::array kTable = {
    Entry{DType::F32, {"F32", 1, 4, true}},
    Entry{DType::F16, {"F16", 1, 2, true}},
    Entry{DType::Q4_0, {"Q4_0", 32, 18, true}},
    Entry{DType::Q4_1, {"Q4_1", 32, 20, true}},
    Entry{DType::Q5_0, {"Q5_0", 32, 22, true}},
    Entry{DType::Q5_1, {"Q5_1", 32, 24, true}},
    Entry{DType::Q8_0, {"Q8_0", 32, 34, true}},
    Entry{DType::Q8_1, {"Q8_1", 32, 36, false}},
    Entry{DType::Q2_K, {"Q2_K", QK_K, 84, true}},
    Entry{DType::Q3_K, {"Q3_K", QK_K, 110, true}},
    Entry{DType::Q4_K, {"Q4_K", QK_K, 144, true}},
    Entry{DType::Q5_K, {"Q5_K", QK_K, 176, true}},
    Entry{DType::Q6_K, {"Q6_K", QK_K, 210, true}},
    Entry{DType::Q8_K, {"Q8_K", QK_K, 292, false}},
    Entry{DType::IQ2_XXS, {"IQ2_XXS", QK_K, 66, false}},
    Entry{DType::IQ2_XS, {"IQ2_XS", QK_K, 74, false}},
    Entry{DType::IQ3_XXS, {"IQ3_XXS", QK_K, 98, false}},
    Entry{DType::IQ1_S, {"IQ1_S", QK_K, 50, false}},
    Entry{DType::IQ4_NL, {"IQ4_NL", 32, 18, true}},
    Entry{DType::IQ3_S, {"IQ3_S", QK_K, 110, false}},
    Entry{DType::IQ2_S, {"IQ2_S", QK_K, 82, false}},
    Entry{DType::IQ4_XS, {"IQ4_XS", QK_K, 136, true}},
    Entry{DType::I8, {"I8", 1, 1, false}},
    Entry{DType::I16, {"I16", 1, 2, false}},
    Entry{DType::I32, {"I32", 1, 4, false}},
    Entry{DType::I64, {"I64", 1, 8, false}},
    Entry{DType::F64, {"F64", 1, 8, false}},
    Entry{DType::IQ1_M, {"IQ1_M", QK_K, 56, false}},
    Entry{DType::BF16, {"BF16", 1, 2, true}},
    Entry{DType::TQ1_0, {"TQ1_0", QK_K, 54, false}},
    Entry{DType::TQ2_0, {"TQ2_0", QK_K, 66, false}},
    Entry{DType::MXFP4, {"MXFP4", 32, 17, false}},
};

}  // namespace

std::optional<DTypeTraits> dtype_traits(uint32_t id) {
  for (const auto& e : kTable) {
    if (static_cast<uint32_t>(e.type) == id) return e.traits;
  }
  return std::nullopt;
}

const DTypeTraits& traits(DType type) {
  for (const auto& e : kTable) {
    if (e.type == type) return e.traits;
  }
  fail("internal: DType {} missing from the type table", static_cast<uint32_t>(type));
}

std::string dtype_name(uint32_t id) {
  auto t = dtype_traits(id);
  return t ? std::string(t->name) : fmt::format("unknown type {}", id);
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kTable) {
    if (e.traits.name.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i) {
      same = std::toupper(static_cast<unsigned char>(name[i])) == e.traits.name[i];
    }
    if (same) return e.type;
  }
  return std::nullopt;
}

}  // namespace qwenrt
