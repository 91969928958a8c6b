#include "ops/cpu/matmul_gemm.h"

namespace qwenrt::ops::cpu {

bool gemm_eligible(DType, int64_t, Isa) {
  return false;
}

void gemm_rows(const TensorView&, int64_t, int64_t, const PreparedAct&, float*, int64_t,
               ScratchBuffer&) {}

}  // namespace qwenrt::ops::cpu
