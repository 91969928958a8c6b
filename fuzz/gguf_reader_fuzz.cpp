// libFuzzer target for the GGUF reader: any input either fails with an Error or yields a File
// that is safe to read everywhere; every File that opens then goes through model::Config and the
// weight binder of its architecture, which must refuse bad metadata with an Error (one line), never
// crash. Build with -DQWENRT_FUZZ=ON (clang); see fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "core/error.h"
#include "gguf/json.h"
#include "gguf/reader.h"
#include "model/config.h"
#include "model/weights.h"

namespace {

using qwenrt::gguf::File;
using qwenrt::gguf::Value;
using qwenrt::gguf::ValueType;

// Reads every scalar and every array item, recursively, and folds them into a checksum the
// optimiser cannot drop.
uint64_t touch_value(const Value& value) {
  uint64_t sum = static_cast<uint64_t>(value.type);
  if (value.type == ValueType::ARRAY) {
    const auto& array = value.as_array();
    sum += static_cast<uint64_t>(array.elem_type);
    for (const auto& item : array.items) {
      if (item.type != array.elem_type) std::abort();  // an array holds one type
      sum += touch_value(item);
    }
  } else if (value.type == ValueType::STRING) {
    const std::string& s = value.as_string();
    sum += s.size() + (s.empty() ? 0 : static_cast<unsigned char>(s.back()));
  } else {
    sum += value.to_display().size();
  }
  return sum;
}

void touch(const File& file) {
  volatile uint64_t sum = file.version() + file.alignment() + file.data_offset();
  for (const auto& kv : file.metadata()) {
    if (kv.key.empty() || file.find(kv.key) != &kv.value) std::abort();
    sum = sum + touch_value(kv.value) + kv.value.to_display().size();
  }
  if (file.data_offset() > file.file_size() && !file.tensors().empty()) std::abort();
  for (const auto& t : file.tensors()) {
    if (t.name.empty() || file.find_tensor(t.name) != &t) std::abort();
    if (t.n_dims < 1 || t.n_dims > qwenrt::kMaxDims || t.n_elements() < 1 || t.n_bytes < 1) {
      std::abort();
    }
    // Out-of-range data shows up as an ASan report on the copy from_bytes() holds.
    sum = sum + t.data[0] + t.data[t.n_bytes - 1];
    sum = sum + t.view().row_bytes() + t.shape_string().size();
    sum = sum + std::string(qwenrt::dtype_name(t.dtype)).size();
  }
  // `qwenrt info --json` prints this; strings need not be UTF-8, hence the replace handler.
  sum = sum + qwenrt::gguf::to_json(file)
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                  .size();
  (void)sum;
}

// The model layer over an opened file: config, then the architecture's binder (shapes and types
// only; no weight data is read).
void load_model_metadata(const File& file) {
  using namespace qwenrt::model;
  try {
    const Config config = Config::from_gguf(file);
    if (config.is_qwen4exp()) {
      (void)bind_qwen4exp(file, config);
    } else if (config.is_moe()) {
      (void)bind_qwen35moe(file, config);
    } else {
      (void)bind_qwen35(file, config);
    }
  } catch (const qwenrt::Error& e) {
    const std::string message = e.what();
    if (message.empty() || message.find('\n') != std::string::npos) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = File::from_bytes(std::span<const uint8_t>(data, size), "fuzz.gguf");
  if (file.ok()) {
    touch(*file);
    load_model_metadata(*file);
  } else if (file.error().empty() || file.error().find('\n') != std::string::npos) {
    std::abort();  // every failure is one non-empty line
  }
  return 0;
}
