// Test support: caps the cpu matmul's ISA while alive. At AVX-512 the cpu matmul runs n < 4 rows as
// a GEMV and n >= 4 as a VNNI GEMM whose fp32 sums round differently (~1e-6 relative); the int8
// activations of the next matmul can turn that into a whole quantisation step, so a greedy
// near-tie may fall the other way in a batch. Below AVX-512 the GEMV serves every n and a row's
// result does not depend on the batch: tests that need bit-equal batches run there.
#pragma once

#include "ops/cpu/isa.h"

namespace qwenrt::testing_support {

class MatmulIsaCap {
 public:
  explicit MatmulIsaCap(ops::cpu::Isa cap = ops::cpu::Isa::kAvx2) {
    if (ops::cpu::active_isa() > cap) ops::cpu::set_isa_for_testing(cap);
  }
  ~MatmulIsaCap() { ops::cpu::set_isa_for_testing(ops::cpu::detected_isa()); }
  MatmulIsaCap(const MatmulIsaCap&) = delete;
  MatmulIsaCap& operator=(const MatmulIsaCap&) = delete;
};

}  // namespace qwenrt::testing_support
