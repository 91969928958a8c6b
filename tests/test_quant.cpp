// quant/: float conversions, block layouts, round trips, errors.
// Bit-exactness against the PyPI gguf package is checked in tests/python/test_quant_interop.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwenrt::quant {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
bool is_half_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

// Value of a half from its fields, computed independently of fp16_to_fp32 (finite halves only).
double half_value(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// --- fp16 -----------------------------------------------------------------------------------

TEST(QuantFloat, Fp16ExhaustiveRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fp16_to_fp32(h);
    if (is_half_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
    } else if ((h & 0x7fff) == 0x7c00) {
      ASSERT_TRUE(std::isinf(f)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(f), half_value(h)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;  // -0 stays -0
    }
    // The payload of a NaN survives too (numpy's behaviour), so this is exact for all patterns.
    ASSERT_EQ(fp32_to_fp16(f), h) << std::hex << i;
  }
}

TEST(QuantFloat, Fp16KnownValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7bff);  // just below the tie: largest finite
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);    // tie, odd mantissa: up to infinity
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);    // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);    // tie between 0 and 2^-24: even
  EXPECT_EQ(fp32_to_fp16(0x1.8p-24f), 0x0002);  // tie between 1 and 2 ulps: even
  EXPECT_EQ(fp32_to_fp16(0x1.0p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(0x1.ffcp-15f), 0x0400);     // tie above 0x03ff: up into the normals
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);  // tie: even (down)
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x3p-11f), 0x3c02);  // tie: even (up)
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(is_half_nan(fp32_to_fp16(kNaN)));
  EXPECT_TRUE(is_half_nan(fp32_to_fp16(std::bit_cast<float>(0x7f800001u))));  // payload lost
  EXPECT_TRUE(is_half_nan(fp32_to_fp16(std::bit_cast<float>(0xff800001u))));
}

// Rounding property on a stride through all float patterns: the result is a nearest half, and
// on a tie the even one. Checked against neighbours in double, not against another converter.
TEST(QuantFloat, Fp16RoundsToNearestEven) {
  auto check = [](float f) {
    const uint16_t h = fp32_to_fp16(f);
    if (std::isnan(f)) return is_half_nan(h);
    const double x = f;
    if (std::fabs(x) >= 65520.0) return (h & 0x7fff) == 0x7c00 && ((h & 0x8000) != 0) == (x < 0);
    if ((h & 0x7fff) >= 0x7c00) return false;
    const double v = half_value(h);
    const double err = std::fabs(x - v);
    const uint16_t mag = h & 0x7fff;
    const uint16_t sign = h & 0x8000;
    for (int step : {-1, 1}) {
      const int other = mag + step;
      if (other < 0 || other > 0x7bff) continue;
      const double other_err = std::fabs(x - half_value(static_cast<uint16_t>(sign | other)));
      if (other_err < err) return false;
      if (other_err == err && (mag & 1)) return false;  // tie must go to the even mantissa
    }
    return true;
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(u));
    ASSERT_TRUE(check(f)) << std::hex << u;
  }
  // Every exact midpoint between adjacent finite halves (needs 12 bits: exact in float).
  for (uint32_t m = 0; m < 0x7bff; ++m) {
    const double mid =
        (half_value(static_cast<uint16_t>(m)) + half_value(static_cast<uint16_t>(m + 1))) / 2;
    ASSERT_TRUE(check(static_cast<float>(mid))) << m;
    ASSERT_TRUE(check(static_cast<float>(-mid))) << m;
  }
}

// --- bf16 -----------------------------------------------------------------------------------

TEST(QuantFloat, Bf16ExhaustiveRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = bf16_to_fp32(h);
    ASSERT_EQ(bits(f), i << 16);
    const uint16_t back = fp32_to_bf16(f);
    if (std::isnan(f)) {
      // ggml forces NaNs quiet: the quiet bit is set, everything else kept.
      ASSERT_EQ(back, h | 0x40) << std::hex << i;
    } else {
      ASSERT_EQ(back, h) << std::hex << i;
    }
  }
}

TEST(QuantFloat, Bf16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even: down
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd: up
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // FLT_MAX: to infinity
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x00000001u)), 0x0000);  // subnormal: to zero
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x80018000u)), 0x8002);  // subnormal tie, odd: up
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);  // sNaN: quieted
}

// --- block layouts and the type table --------------------------------------------------------

template <class Block>
void expect_geometry() {
  const DTypeTraits& t = traits(Block::kType);
  EXPECT_EQ(sizeof(Block), t.block_bytes) << t.name;
  EXPECT_EQ(static_cast<uint32_t>(Block::kElems), t.block_elems) << t.name;
  EXPECT_TRUE(t.dequant) << t.name;
}

TEST(QuantBlocks, SizesMatchTypeTable) {
  expect_geometry<BlockQ4_0>();
  expect_geometry<BlockQ4_1>();
  expect_geometry<BlockQ5_0>();
  expect_geometry<BlockQ5_1>();
  expect_geometry<BlockQ8_0>();
  expect_geometry<BlockQ2_K>();
  expect_geometry<BlockQ3_K>();
  expect_geometry<BlockQ4_K>();
  expect_geometry<BlockQ5_K>();
  expect_geometry<BlockQ6_K>();
  expect_geometry<BlockIQ4_NL>();
  expect_geometry<BlockIQ4_XS>();
}

// The `dequant` flag in core/dtype.cpp is what the loader trusts: it must match this module.
TEST(QuantBlocks, CanDequantizeMatchesTypeTable) {
  int supported = 0;
  for (uint32_t id = 0; id < 256; ++id) {
    const auto t = dtype_traits(id);
    const auto type = static_cast<DType>(id);
    if (!t) {
      EXPECT_FALSE(can_dequantize(type)) << id;
      EXPECT_FALSE(can_quantize(type)) << id;
      continue;
    }
    EXPECT_EQ(can_dequantize(type), t->dequant) << t->name;
    supported += can_dequantize(type);
  }
  EXPECT_EQ(supported, 15);
  EXPECT_TRUE(can_quantize(DType::Q4_K));
  EXPECT_FALSE(can_quantize(DType::IQ2_XXS));
}

// quantize_block must write every byte of the block itself: the same input into a block
// pre-filled with 0x00 and with 0xff must give the same bytes.
template <class Block>
void expect_every_byte_written(const std::vector<float>& x) {
  Block zeros, ones;
  std::memset(&zeros, 0x00, sizeof zeros);
  std::memset(&ones, 0xff, sizeof ones);
  quantize_block(x.data(), zeros);
  quantize_block(x.data(), ones);
  EXPECT_EQ(std::memcmp(&zeros, &ones, sizeof zeros), 0) << dtype_name(Block::kType);
}

TEST(QuantBlocks, QuantizeWritesEveryByte) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> x(kQK_K);
    for (float& v : x)
      v = variant == 0 ? normal(rng) : variant == 1 ? 0.0f : -std::fabs(normal(rng));
    expect_every_byte_written<BlockQ4_0>(x);
    expect_every_byte_written<BlockQ4_1>(x);
    expect_every_byte_written<BlockQ5_0>(x);
    expect_every_byte_written<BlockQ5_1>(x);
    expect_every_byte_written<BlockQ8_0>(x);
    expect_every_byte_written<BlockQ2_K>(x);
    expect_every_byte_written<BlockQ3_K>(x);
    expect_every_byte_written<BlockQ4_K>(x);
    expect_every_byte_written<BlockQ5_K>(x);
    expect_every_byte_written<BlockQ6_K>(x);
    expect_every_byte_written<BlockIQ4_NL>(x);
    expect_every_byte_written<BlockIQ4_XS>(x);
  }
}

// --- hand-built blocks: the layouts, independent of any other implementation ----------------

TEST(QuantLayout, LegacyBlocks) {
  BlockQ4_0 q40{};
  q40.d = fp32_to_fp16(0.5f);
  q40.qs[0] = 0x0f;  // element 0: 15 - 8 = 7; element 16: 0 - 8 = -8
  q40.qs[3] = 0x98;  // element 3: 0; element 19: 1
  float y[32];
  dequantize_block(q40, y);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[16], -4.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[19], 0.5f);
  EXPECT_EQ(y[1], -4.0f);

  BlockQ5_1 q51{};
  q51.d = fp32_to_fp16(0.25f);
  q51.m = fp32_to_fp16(-1.0f);
  q51.qh[2] = 0x01;  // bit 16: fifth bit of element 16
  q51.qs[0] = 0x3f;  // element 0: 15, element 16: 3 + 16 = 19
  dequantize_block(q51, y);
  EXPECT_EQ(y[0], 2.75f);
  EXPECT_EQ(y[16], 3.75f);
  EXPECT_EQ(y[1], -1.0f);

  BlockQ8_0 q80{};
  q80.d = fp32_to_fp16(0.125f);
  q80.qs[31] = -128;
  dequantize_block(q80, y);
  EXPECT_EQ(y[31], -16.0f);
}

TEST(QuantLayout, Q4KScalesAndMins) {
  // Sub-block 5's 6-bit scale is (scales[9] & 0xf) | (scales[1] >> 6) << 4, its min
  // (scales[9] >> 4) | (scales[5] >> 6) << 4 (ggml's get_scale_min_k4).
  BlockQ4_K b{};
  b.d = fp32_to_fp16(1.0f);
  b.dmin = fp32_to_fp16(0.5f);
  b.scales[9] = 0x23;         // scale low 3, min low 2
  b.scales[1] = 0x80 | 0x01;  // scale high 2 -> scale = 35; sub-block 1 scale = 1
  b.scales[5] = 0x40 | 0x04;  // min high 1 -> min = 18; sub-block 1 min = 4
  b.qs[32 * 2 + 7] = 0x90;    // sub-block 5 = high nibbles of bytes 64..95: element 160+7 -> 9
  b.qs[7] = 0x0c;             // sub-block 0 element 7 -> 12 (scale 0, min 0)
  float y[kQK_K];
  dequantize_block(b, y);
  EXPECT_EQ(y[160 + 7], 35.0f * 9 - 0.5f * 18);
  EXPECT_EQ(y[160 + 8], -0.5f * 18);
  EXPECT_EQ(y[7], 0.0f);
  EXPECT_EQ(y[32], -2.0f);  // sub-block 1: scale 1, min 4, level 0
}

TEST(QuantLayout, Q6KAndIQ4) {
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.5f);
  b.scales[0] = 2;
  b.scales[6] = -3;  // sub-block 6 = elements 96..111
  b.ql[0] = 0x21;    // element 0 low 1; element 64 low 2
  b.qh[0] = 0x81;    // element 0 high 1 -> 17 - 32 = -15; element 96 high 2
  b.ql[32] = 0x50;   // element 96 low 5 -> 5 | 32 = 37 - 32 = 5
  float y[kQK_K];
  dequantize_block(b, y);
  EXPECT_EQ(y[0], 0.5f * 2 * -15);
  EXPECT_EQ(y[96], 0.5f * -3 * 5);

  BlockIQ4_NL nl{};
  nl.d = fp32_to_fp16(0.5f);
  nl.qs[0] = 0xf0;  // element 0 -> -127, element 16 -> 113
  float z[32];
  dequantize_block(nl, z);
  EXPECT_EQ(z[0], -63.5f);
  EXPECT_EQ(z[16], 56.5f);

  BlockIQ4_XS xs{};
  xs.d = fp32_to_fp16(0.25f);
  xs.scales_l[1] = 0x50;     // sub-block 3: low 5
  xs.scales_h = 0x3 << 6;    // sub-block 3: high 3 -> 53 - 32 = 21
  xs.qs[16 * 3 + 2] = 0x08;  // sub-block 3, element 2 -> value 1
  dequantize_block(xs, y);
  EXPECT_EQ(y[96 + 2], 0.25f * 21 * 1);
  EXPECT_EQ(y[0], 0.25f * -32 * -127);
}

// --- round trips on fresh random data --------------------------------------------------------

struct RoundTripCase {
  DType type;
  double max_rel_rms;  // ||x - dequant(quant(x))|| / ||x|| on unit Gaussian data
};

// Bounds ~1.25x the measured error (tests/python/test_quant_interop.py has the measurements).
// Q8_0 cannot go below ~0.5% on Gaussian data: its step is amax/127 and step/sqrt(12) ~ 0.48%.
const RoundTripCase kRoundTrips[] = {
    {DType::F32, 0.0},    {DType::F16, 2.6e-4},   {DType::BF16, 2.1e-3},  {DType::Q8_0, 0.0067},
    {DType::Q4_0, 0.107}, {DType::Q4_1, 0.098},   {DType::Q5_0, 0.053},   {DType::Q5_1, 0.047},
    {DType::Q2_K, 0.37},  {DType::Q3_K, 0.19},    {DType::Q4_K, 0.089},   {DType::Q5_K, 0.045},
    {DType::Q6_K, 0.022}, {DType::IQ4_NL, 0.095}, {DType::IQ4_XS, 0.096},
};

// Names the case in test output instead of dumping its bytes.
void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << dtype_name(c.type);
}

class QuantRoundTrip : public testing::TestWithParam<RoundTripCase> {};

TEST_P(QuantRoundTrip, ErrorWithinBoundOnOddBlockCounts) {
  const RoundTripCase c = GetParam();
  const DTypeTraits& t = traits(c.type);
  std::mt19937 rng(1000 + static_cast<uint32_t>(c.type));
  std::normal_distribution<float> normal;
  for (int64_t n_blocks : {1, 3, 37}) {
    const int64_t n = n_blocks * std::max<int64_t>(t.block_elems, 32);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);

    std::vector<uint8_t> blocks(static_cast<size_t>(n / t.block_elems * t.block_bytes), 0xa5);
    quantize(c.type, x.data(), blocks.data(), n, "roundtrip");
    std::vector<float> y(static_cast<size_t>(n), kNaN);  // poisoned: an unwritten element fails
    dequantize(c.type, blocks.data(), y.data(), n, "roundtrip");

    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << t.name << " element " << i << " of " << n;
      err2 += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      ref2 += static_cast<double>(x[i]) * x[i];
    }
    const double rel_rms = std::sqrt(err2 / ref2);
    // With one block the sample is small: allow 1.5x there.
    const double bound = c.max_rel_rms * (n_blocks == 1 ? 1.5 : 1.0);
    EXPECT_LE(rel_rms, bound) << t.name << " with " << n_blocks << " blocks";
  }
}

// The output buffer is written completely and only there: pre-filling it differently must not
// change the result, and the byte after it stays untouched.
TEST_P(QuantRoundTrip, QuantizeWritesExactlyItsOutput) {
  const RoundTripCase c = GetParam();
  const DTypeTraits& t = traits(c.type);
  const int64_t n = 5 * std::max<int64_t>(t.block_elems, 32);
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = uniform(rng);
  const size_t size = static_cast<size_t>(n / t.block_elems * t.block_bytes);
  std::vector<uint8_t> a(size + 1, 0x00), b(size + 1, 0xff);
  quantize(c.type, x.data(), a.data(), n);
  quantize(c.type, x.data(), b.data(), n);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(size), b.begin()))
      << t.name;
  EXPECT_EQ(a[size], 0x00);
  EXPECT_EQ(b[size], 0xff);
}

// Blocks inside a GGUF need not be aligned: decoding from an odd address gives the same floats,
// and decoding many blocks at once equals decoding them one by one.
TEST_P(QuantRoundTrip, UnalignedSourceAndBlockwiseAgree) {
  const RoundTripCase c = GetParam();
  const DTypeTraits& t = traits(c.type);
  const int64_t n_blocks = 7;
  const int64_t n = n_blocks * t.block_elems;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  const size_t size = static_cast<size_t>(n_blocks * t.block_bytes);
  std::vector<uint8_t> blocks(size + 1);
  quantize(c.type, x.data(), blocks.data() + 1, n);

  std::vector<float> all(static_cast<size_t>(n), kNaN);
  dequantize(c.type, blocks.data() + 1, all.data(), n);
  for (int64_t i = 0; i < n_blocks; ++i) {
    std::vector<float> one(t.block_elems, kNaN);
    dequantize(c.type, blocks.data() + 1 + i * t.block_bytes, one.data(), t.block_elems);
    for (uint32_t j = 0; j < t.block_elems; ++j) {
      ASSERT_EQ(bits(one[j]), bits(all[static_cast<size_t>(i * t.block_elems + j)]))
          << t.name << " block " << i << " element " << j;
    }
  }
}

TEST_P(QuantRoundTrip, ZeroAndEmptyInputs) {
  const RoundTripCase c = GetParam();
  const DTypeTraits& t = traits(c.type);
  const int64_t n = 3 * t.block_elems;
  std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  std::vector<uint8_t> blocks(static_cast<size_t>(3 * t.block_bytes));
  quantize(c.type, zeros.data(), blocks.data(), n);
  std::vector<float> y(static_cast<size_t>(n), kNaN);
  dequantize(c.type, blocks.data(), y.data(), n);
  for (float v : y) ASSERT_EQ(v, 0.0f) << t.name;
  // n = 0 is valid and touches nothing (null pointers allowed).
  EXPECT_NO_THROW(dequantize(c.type, nullptr, nullptr, 0));
  EXPECT_NO_THROW(quantize(c.type, nullptr, nullptr, 0));
}

// Garbage in (NaN, infinities, values near FLT_MAX, subnormals) must still be defined
// behaviour: no out-of-range float-to-int conversion, every output byte written.
TEST_P(QuantRoundTrip, NonFiniteInputIsDefined) {
  const RoundTripCase c = GetParam();
  const DTypeTraits& t = traits(c.type);
  const int64_t n = 4 * std::max<int64_t>(t.block_elems, 32);
  const float specials[] = {kNaN,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            3e38f,
                            -3e38f,
                            std::numeric_limits<float>::denorm_min(),
                            1e-30f,
                            0.0f};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) {
    // First quarter: one special among normal values; then all-special blocks.
    x[i] = i < x.size() / 4 ? (i == 5 ? specials[0] : normal(rng)) : specials[i % 8];
  }
  const size_t size = static_cast<size_t>(n / t.block_elems * t.block_bytes);
  std::vector<uint8_t> a(size, 0x00), b(size, 0xff);
  quantize(c.type, x.data(), a.data(), n);
  quantize(c.type, x.data(), b.data(), n);
  EXPECT_EQ(a, b) << t.name;
  std::vector<float> y(static_cast<size_t>(n));
  dequantize(c.type, a.data(), y.data(), n);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantRoundTrip, testing::ValuesIn(kRoundTrips),
                         [](const testing::TestParamInfo<RoundTripCase>& info) {
                           return std::string(dtype_name(info.param.type));
                         });

// --- errors ----------------------------------------------------------------------------------

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(QuantErrors, UnsupportedTypeNamesTensorTypeAndAlternatives) {
  std::vector<uint8_t> src(66);
  std::vector<float> dst(256);
  const std::string msg = error_of(
      [&] { dequantize(DType::IQ2_XXS, src.data(), dst.data(), 256, "blk.0.ffn_up.weight"); });
  EXPECT_NE(msg.find("tensor 'blk.0.ffn_up.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("type IQ2_XXS is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported: F32, F16, Q4_0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("IQ4_XS"), std::string::npos) << msg;

  const std::string unknown =
      error_of([&] { dequantize(static_cast<DType>(77), src.data(), dst.data(), 32, "w"); });
  EXPECT_NE(unknown.find("tensor 'w': unknown type id 77 is not supported"), std::string::npos)
      << unknown;

  const std::string quant =
      error_of([&] { quantize(DType::Q8_1, dst.data(), src.data(), 32, "x.weight"); });
  EXPECT_NE(quant.find("tensor 'x.weight': type Q8_1 is not supported for quantisation"),
            std::string::npos)
      << quant;
}

TEST(QuantErrors, ElementCountNotAMultipleOfTheBlock) {
  std::vector<uint8_t> src(1024);
  std::vector<float> dst(1024);
  const std::string msg = error_of(
      [&] { dequantize(DType::Q4_K, src.data(), dst.data(), 100, "blk.3.attn_q.weight"); });
  EXPECT_EQ(msg,
            "tensor 'blk.3.attn_q.weight': 100 elements is not a multiple of the Q4_K block "
            "size 256");
  const std::string q = error_of([&] { quantize(DType::Q8_0, dst.data(), src.data(), 33); });
  EXPECT_EQ(q, "33 elements is not a multiple of the Q8_0 block size 32");
  EXPECT_NE(error_of([&] {
              dequantize(DType::F16, src.data(), dst.data(), -2, "t");
            }).find("negative element count -2"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { dequantize(DType::Q8_0, nullptr, dst.data(), 32, "t"); }).find("null buffer"),
      std::string::npos);
}

}  // namespace
}  // namespace qwenrt::quant
