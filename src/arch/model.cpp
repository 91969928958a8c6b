#include "arch/model.h"

#include "core/error.h"

namespace qwenrt::arch {

std::unique_ptr<Model> make_model(const gguf::File& file, const model::Config& config,
                                  ops::Ops& ops, model::Shard shard) {
  switch (config.arch) {
    case model::Arch::kQwen35:
      return make_qwen35(file, config, ops, shard);
    case model::Arch::kQwen35Moe:
      return make_qwen35moe(file, config, ops, shard);
    case model::Arch::kQwen4Exp:
      if (shard.size > 1) fail("tensor parallel: not implemented for {}", config.arch_name);
      return make_qwen4exp(file, config, ops);
  }
  fail("unknown architecture '{}'", config.arch_name);
}

}  // namespace qwenrt::arch
