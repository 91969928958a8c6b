#include "arch/model.h"

#include "core/error.h"

namespace qwenrt::arch {

std::unique_ptr<Model> make_model(const gguf::File& file, const model::Config& config,
                                  ops::Ops& ops) {
  switch (config.arch) {
    case model::Arch::kQwen35:
      return make_qwen35(file, config, ops);
    case model::Arch::kQwen35Moe:
      return make_qwen35moe(file, config, ops);
    case model::Arch::kQwen4Exp:
      return make_qwen4exp(file, config, ops);
  }
  fail("unknown architecture '{}'", config.arch_name);
}

}  // namespace qwenrt::arch
