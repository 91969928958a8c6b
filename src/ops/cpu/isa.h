// Which SIMD level the CPU kernels use: detected once at startup, overridable by tests so each
// path this machine supports is exercised.
#pragma once

namespace qwenrt::ops::cpu {

enum class Isa {
  kScalar,  // portable C++
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512 F/BW/VL + VNNI (Zen 4, Ice Lake and later)
};

// The level the kernels use now: the detected one unless a test lowered it.
Isa active_isa();
// The best level this CPU supports.
Isa detected_isa();
// Forces a level for tests; a level above detected_isa() is clamped to it.
void set_isa_for_testing(Isa isa);
const char* isa_name(Isa isa);

}  // namespace qwenrt::ops::cpu
