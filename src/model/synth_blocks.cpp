// Random quantised blocks drawn directly (no float pass), for `qwenrt synth`: the distributions
// are docs/synth.md's table.
#include "model/synth_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace qwenrt::model::synth_blocks {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t s = a ^ (b * 0x9e3779b97f4a7c15ull);
  return splitmix64(s);
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (const char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

namespace {

// xoshiro256**: fast enough that drawing 20 GB of quants is bounded by the disk.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) {
    for (auto& s : s_) s = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Mean of v^2 for v uniform over the integers lo..hi.
constexpr double mean_square(int lo, int hi) {
  double sum = 0;
  for (int v = lo; v <= hi; ++v) sum += double(v) * v;
  return sum / (hi - lo + 1);
}

// Q8_0: quants uniform over -127..127 (-128 is folded onto 0, so the mean is exactly 0):
// E[q^2] = 2 * sum(k^2, k = 1..127) / 256.
constexpr double kQ8QuantStd = 73.4677;  // sqrt(5397.5)
// Q4_K: quants uniform over 0..15 (std sqrt(255/12)), each sub-block's min equal to its scale
// and dmin = 7.5 d, so x = d * sc * (q - 7.5): zero mean. Sub-block scales uniform over 8..39.
constexpr int kQ4ScaleLo = 8, kQ4ScaleHi = 39;
const double kQ4QuantStd = std::sqrt(255.0 / 12.0);
// Q6_K: quants uniform over 0..63, x = d * sc * (q - 32): E[(q - 32)^2] = 4095/12 + 1/4. The
// -1/2 bias cancels over sub-blocks because the scales get random signs; |sc| uniform over 4..11.
constexpr int kQ6ScaleLo = 4, kQ6ScaleHi = 11;
const double kQ6QuantStd = std::sqrt(4095.0 / 12.0 + 0.25);

void fill_q8_0(FastRng& rng, uint16_t d, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ8_0 b;
  b.d = d;
  for (int64_t i = 0; i < n_blocks; ++i) {
    for (int w = 0; w < 4; ++w) {
      const uint64_t r = rng.next();
      for (int k = 0; k < 8; ++k) {
        const auto q = static_cast<int8_t>(static_cast<uint8_t>(r >> (8 * k)));
        b.qs[w * 8 + k] = q == -128 ? 0 : q;
      }
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// Q5_0: quants uniform over 0..31, x = d * (q - 16): E[(q - 16)^2] = 1023/12 + 1/4. The -1/2
// bias cancels over blocks because each block's d gets a random sign.
const double kQ5QuantStd = std::sqrt(1023.0 / 12.0 + 0.25);

void fill_q5_0(FastRng& rng, uint16_t d, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ5_0 b;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint64_t q0 = rng.next(), q1 = rng.next(), r = rng.next();
    std::memcpy(b.qs, &q0, 8);
    std::memcpy(b.qs + 8, &q1, 8);
    std::memcpy(b.qh, &r, 4);
    b.d = static_cast<uint16_t>(d | ((r >> 63) ? 0x8000u : 0u));
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void fill_q4_k(FastRng& rng, uint16_t d, uint16_t dmin, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ4_K b;
  b.d = d;
  b.dmin = dmin;
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t sc[8];
    const uint64_t r = rng.next();
    for (int j = 0; j < 8; ++j) sc[j] = static_cast<uint8_t>(kQ4ScaleLo + ((r >> (5 * j)) & 31));
    // The min of each sub-block equals its scale. Packing inverts ggml's get_scale_min_k4: six
    // bits each; sub-blocks 4..7 keep their low nibbles in bytes 8..11 and their top two bits in
    // the top bits of bytes 0..7.
    for (int j = 0; j < 4; ++j) {
      b.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      b.scales[j + 4] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((sc[j + 4] & 15) << 4));
    }
    for (int w = 0; w < 16; ++w) {
      const uint64_t q = rng.next();
      std::memcpy(b.qs + 8 * w, &q, 8);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void fill_q6_k(FastRng& rng, uint16_t d, uint8_t* dst, int64_t n_blocks) {
  quant::BlockQ6_K b;
  b.d = d;
  for (int64_t i = 0; i < n_blocks; ++i) {
    for (int w = 0; w < 16; ++w) {
      const uint64_t q = rng.next();
      std::memcpy(b.ql + 8 * w, &q, 8);
    }
    for (int w = 0; w < 8; ++w) {
      const uint64_t q = rng.next();
      std::memcpy(b.qh + 8 * w, &q, 8);
    }
    const uint64_t r = rng.next();
    for (int j = 0; j < 16; ++j) {
      const int magnitude = kQ6ScaleLo + static_cast<int>((r >> (4 * j)) & 7);
      const bool negative = (r >> (64 - 16 + j)) & 1;
      b.scales[j] = static_cast<int8_t>(negative ? -magnitude : magnitude);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

}  // namespace

int64_t row_count(const SynthTensor& t) {
  int64_t rows = 1;
  for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
  return rows;
}

bool has_direct_blocks(DType type) {
  return type == DType::Q8_0 || type == DType::Q4_K || type == DType::Q6_K || type == DType::Q5_0;
}

// Fills blocks [first_block, first_block + dst.size() / block_bytes) of a matrix of
// N(0, sigma^2)-like values, each chunk of kChunk blocks from its own seed (so the bytes depend
// on neither the thread count nor how the matrix is split into pieces; first_block is a multiple
// of kChunk).
void fill_direct(ThreadPool& pool, DType type, float sigma, uint64_t seed, std::span<uint8_t> dst,
                 int64_t first_block) {
  const auto& tr = traits(type);
  const int64_t n_blocks = static_cast<int64_t>(dst.size() / tr.block_bytes);
  const int64_t n_chunks = (n_blocks + kChunk - 1) / kChunk;
  const int64_t first_chunk = first_block / kChunk;
  uint16_t d = 0, dmin = 0;
  if (type == DType::Q5_0) {
    d = quant::fp32_to_fp16(static_cast<float>(sigma / kQ5QuantStd));
  } else if (type == DType::Q8_0) {
    d = quant::fp32_to_fp16(static_cast<float>(sigma / kQ8QuantStd));
  } else if (type == DType::Q4_K) {
    const double rms = std::sqrt(mean_square(kQ4ScaleLo, kQ4ScaleHi));
    d = quant::fp32_to_fp16(static_cast<float>(sigma / (kQ4QuantStd * rms)));
    dmin = quant::fp32_to_fp16(7.5f * quant::fp16_to_fp32(d));
  } else {
    const double rms = std::sqrt(mean_square(kQ6ScaleLo, kQ6ScaleHi));
    d = quant::fp32_to_fp16(static_cast<float>(sigma / (kQ6QuantStd * rms)));
  }
  if (!std::isfinite(quant::fp16_to_fp32(d)) || quant::fp16_to_fp32(d) == 0.0f) {
    fail("synth: scale {} gives no finite f16 block scale for {}", sigma, tr.name);
  }
  pool.parallel_for(n_chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      FastRng rng(mix_seed(seed, static_cast<uint64_t>(first_chunk + c)));
      const int64_t b0 = c * kChunk, nb = std::min(kChunk, n_blocks - b0);
      uint8_t* out = dst.data() + b0 * tr.block_bytes;
      if (type == DType::Q5_0) {
        fill_q5_0(rng, d, out, nb);
      } else if (type == DType::Q8_0) {
        fill_q8_0(rng, d, out, nb);
      } else if (type == DType::Q4_K) {
        fill_q4_k(rng, d, dmin, out, nb);
      } else {
        fill_q6_k(rng, d, out, nb);
      }
    }
  });
}

}  // namespace qwenrt::model::synth_blocks
