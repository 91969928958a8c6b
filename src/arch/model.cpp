#include "arch/model.h"

#include "core/error.h"

namespace qwenrt::arch {

std::unique_ptr<Model> make_model(const gguf::File& file, const model::Config& config,
                                  ops::Ops& ops, Split split) {
  switch (config.arch) {
    case model::Arch::kQwen35:
      return make_qwen35(file, config, ops, split);
    case model::Arch::kQwen35Moe:
      return make_qwen35moe(file, config, ops, split);
    case model::Arch::kQwen4Exp:
      if (split.shard.size > 1) fail("tensor parallel: not implemented for {}", config.arch_name);
      if (split.stage.count > 1)
        fail("pipeline parallel: not implemented for {}", config.arch_name);
      return make_qwen4exp(file, config, ops);
  }
  fail("unknown architecture '{}'", config.arch_name);
}

}  // namespace qwenrt::arch
