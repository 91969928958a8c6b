// Memory bandwidth of this machine, the ceiling for batch-1 decode (which streams the weights once
// per token): read-only (sum a large array, as a matrix-vector product does) and copy.
//
//   g++ -O3 -march=native -std=c++20 -pthread bench/membw.cpp -o build-bench/membw
//   build-bench/membw [--mib 1024] [--threads 1,2] [--repeats 11]
//
// Each thread owns one contiguous slice (first touched by that thread). GB/s = 1e9 bytes per
// second, median of the repeats (min..max shown). read: bytes read. copy: bytes read + bytes
// written (memcpy of one buffer into another of the same size; the copy buffers are half of --mib
// each, so every figure touches the same --mib).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

struct Options {
  size_t mib = 1024;
  std::vector<int> threads{1, 2};
  int repeats = 11;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "membw: %s\nusage: membw [--mib N] [--threads 1,2] [--repeats R]\n", msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--mib") {
      o.mib = std::stoul(v);
    } else if (a == "--repeats") {
      o.repeats = std::stoi(v);
    } else if (a == "--threads") {
      o.threads.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        o.threads.push_back(std::stoi(v.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (o.mib < 16 || o.repeats < 1) usage("--mib must be >= 16 and --repeats >= 1");
  for (int t : o.threads)
    if (t < 1) usage("--threads must be >= 1");
  return o;
}

// 2 MiB aligned; huge: ask for transparent huge pages (madvise), else leave the kernel's default
// (4 KiB pages unless THP is "always"; a file mapping, like mmap-ed weights, gets 4 KiB pages).
uint64_t* alloc_words(size_t words, bool huge) {
  const size_t bytes =
      (words * sizeof(uint64_t) + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1);
  void* p = std::aligned_alloc(size_t{2} << 20, bytes);
  if (p == nullptr) usage("out of memory");
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<uint64_t*>(p);
}

// Runs fn(begin, end) on `threads` threads, each over its own slice of [0, words); returns seconds.
template <class Fn>
double on_threads(int threads, size_t words, Fn fn) {
  std::vector<std::thread> pool;
  const size_t per = (words / threads) & ~size_t{63};
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    const size_t b = per * t;
    const size_t e = t + 1 == threads ? words : b + per;
    pool.emplace_back([=] { fn(t, b, e); });
  }
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums words [b, e) of p. 256 bytes per iteration into four independent vector accumulators, so
// that the loop is never the limit (the compiler's own vectorisation of a scalar sum keeps one
// accumulator and reads measurably slower here).
uint64_t sum(const uint64_t* p, size_t b, size_t e) {
  size_t i = b;
  uint64_t s = 0;
#if defined(__AVX512F__)
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 32 <= e; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
  }
  alignas(64) uint64_t l[8];
  _mm512_store_si512(l, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  for (uint64_t v : l) s += v;
#elif defined(__AVX2__)
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= e; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t l[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  for (uint64_t v : l) s += v;
#endif
  for (; i < e; ++i) s += p[i];
  return s;
}

struct Stat {
  double median, lo, hi;
};

Stat stat_of(std::vector<double> gbs) {
  std::sort(gbs.begin(), gbs.end());
  const size_t n = gbs.size();
  const double med = n % 2 ? gbs[n / 2] : 0.5 * (gbs[n / 2 - 1] + gbs[n / 2]);
  return {med, gbs.front(), gbs.back()};
}

volatile uint64_t g_sink;

void report(const char* test, bool huge, int threads, std::vector<double> gbs) {
  const Stat st = stat_of(std::move(gbs));
  char range[64];
  std::snprintf(range, sizeof range, "%.1f..%.1f", st.lo, st.hi);
  std::printf("%-6s %-6s %4d %10.1f %16s\n", test, huge ? "huge" : "4k", threads, st.median, range);
}

void read_test(const Options& o, size_t words, int threads, bool huge) {
  uint64_t* a = alloc_words(words, huge);
  on_threads(threads, words, [&](int t, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) a[i] = i * 0x9E3779B97F4A7C15ull + t;
  });
  std::vector<uint64_t> part(threads);
  auto body = [&](int t, size_t b, size_t e) { part[t] = sum(a, b, e); };
  on_threads(threads, words, body);  // warm-up
  std::vector<double> gbs;
  for (int r = 0; r < o.repeats; ++r) {
    gbs.push_back(words * sizeof(uint64_t) / on_threads(threads, words, body) / 1e9);
    uint64_t total = 0;
    for (uint64_t v : part) total += v;
    g_sink = total;
  }
  std::free(a);
  report("read", huge, threads, std::move(gbs));
}

void copy_test(const Options& o, size_t words, int threads, bool huge) {
  const size_t half = words / 2;
  uint64_t* src = alloc_words(half, huge);
  uint64_t* dst = alloc_words(half, huge);
  on_threads(threads, half, [&](int t, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) src[i] = i + t;
    std::memset(dst + b, 0, (e - b) * sizeof(uint64_t));
  });
  auto body = [&](int, size_t b, size_t e) {
    std::memcpy(dst + b, src + b, (e - b) * sizeof(uint64_t));
  };
  on_threads(threads, half, body);  // warm-up
  std::vector<double> gbs;
  for (int r = 0; r < o.repeats; ++r)
    gbs.push_back(2.0 * half * sizeof(uint64_t) / on_threads(threads, half, body) / 1e9);
  g_sink = dst[half / 3];
  std::free(src);
  std::free(dst);
  report("copy", huge, threads, std::move(gbs));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const size_t words = o.mib * (size_t{1} << 20) / sizeof(uint64_t);
  std::printf("buffer %zu MiB, %d repeats, GB/s = 1e9 B/s, median (min..max)\n", o.mib, o.repeats);
  std::printf("%-6s %-6s %4s %10s %16s\n", "test", "pages", "thr", "GB/s", "min..max");
  for (int threads : o.threads) {
    for (bool huge : {false, true}) {
      read_test(o, words, threads, huge);
      copy_test(o, words, threads, huge);
    }
  }
  return 0;
}
