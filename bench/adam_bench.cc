// adam_bench: the optimizer step on 2^24 and 2^26 parameters with 1 and 2 threads, in parameters/s
// and effective GB/s, beside the memory limit measured in the same run with the same access
// pattern (read four streams, write three back in place, trivial arithmetic; with bf16 gradients
// and the bf16 copy, the same with a 16-bit stream read and one written), and beside
// torch.optim.Adam (foreach) when python3-torch is installed.
//
//   build/bin/adam_bench [--sizes 24,26] [--threads 1,2] [--repeat 5]

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "runtime/optim/adam.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace zerod;

template <typename F>
double BestSeconds(int repeat, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto start = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// The same pattern as Adam with nothing to compute: p += g, m += g, v += g (AVX-512 or AVX2).
__attribute__((target("avx512f"))) void PatternAvx512(float* p, const float* g, float* m, float* v,
                                                      int64_t b, int64_t e) {
  for (int64_t i = b; i + 16 <= e; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), x));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), x));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), x));
  }
}
__attribute__((target("avx2"))) void PatternAvx2(float* p, const float* g, float* m, float* v,
                                                 int64_t b, int64_t e) {
  for (int64_t i = b; i + 8 <= e; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), x));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), x));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), x));
  }
}

// The bf16 pattern: also read 16-bit gradients and write a 16-bit copy of p.
__attribute__((target("avx512f,avx512bw"))) void PatternBf16Avx512(float* p, const uint16_t* g,
                                                                   float* m, float* v,
                                                                   uint16_t* low, int64_t b,
                                                                   int64_t e) {
  for (int64_t i = b; i + 16 <= e; i += 16) {
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i))), 16));
    const __m512 np = _mm512_add_ps(_mm512_loadu_ps(p + i), x);
    _mm512_storeu_ps(p + i, np);
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), x));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(np), 16)));
  }
}
__attribute__((target("avx2"))) void PatternBf16Avx2(float* p, const uint16_t* g, float* m,
                                                     float* v, uint16_t* low, int64_t b,
                                                     int64_t e) {
  for (int64_t i = b; i + 8 <= e; i += 8) {
    const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + i))), 16));
    const __m256 np = _mm256_add_ps(_mm256_loadu_ps(p + i), x);
    _mm256_storeu_ps(p + i, np);
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), x));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), x));
    const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(np), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
}

std::vector<int64_t> ParseList(const char* text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {24, 26}, threads = {1, 2};
  int repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--sizes")) sizes = ParseList(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = ParseList(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
  }
  const optim::Isa isa = optim::BestIsa();
  std::printf(
      "adam_bench: kernel %s; bytes/param: fp32 28 (p,g,m,v read; p,m,v written), "
      "bf16 grads + bf16 copy 26\n",
      std::string(optim::IsaName(isa)).c_str());
  std::printf("%-6s %-7s %-11s %12s %9s %14s %9s\n", "size", "threads", "grads", "Gparams/s",
              "GB/s", "limit GB/s", "of limit");
  for (int64_t log2 : sizes) {
    const int64_t n = int64_t{1} << log2;
    std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    std::vector<uint16_t> g16(n, 0x3c00), low(n, 0);
    for (int64_t t : threads) {
      ThreadPool pool(static_cast<int>(t));
      const double limit_s = BestSeconds(repeat, [&] {
        pool.ParallelFor(n, 64, [&](int64_t b, int64_t e) {
          isa == optim::Isa::kAvx512 ? PatternAvx512(p.data(), g.data(), m.data(), v.data(), b, e)
                                     : PatternAvx2(p.data(), g.data(), m.data(), v.data(), b, e);
        });
      });
      const double limit_gbs = 28.0 * static_cast<double>(n) / limit_s / 1e9;
      const double limit16_s = BestSeconds(repeat, [&] {
        pool.ParallelFor(n, 64, [&](int64_t b, int64_t e) {
          isa == optim::Isa::kAvx512
              ? PatternBf16Avx512(p.data(), g16.data(), m.data(), v.data(), low.data(), b, e)
              : PatternBf16Avx2(p.data(), g16.data(), m.data(), v.data(), low.data(), b, e);
        });
      });
      const double limit16_gbs = 26.0 * static_cast<double>(n) / limit16_s / 1e9;
      for (bool mixed : {false, true}) {
        optim::AdamShard shard;
        shard.param = p.data();
        shard.exp_avg = m.data();
        shard.exp_avg_sq = v.data();
        shard.numel = n;
        if (mixed) {
          shard.grad = g16.data();
          shard.grad_dtype = DType::kBFloat16;
          shard.low_precision = low.data();
        } else {
          shard.grad = g.data();
        }
        int64_t step = 0;
        const double s = BestSeconds(repeat, [&] {
          optim::AdamStep(shard, optim::MakeAdamScalars(optim::AdamConfig{}, ++step), isa, &pool);
        });
        const double bytes = mixed ? 26.0 : 28.0;
        const double gbs = bytes * static_cast<double>(n) / s / 1e9;
        const double limit = mixed ? limit16_gbs : limit_gbs;
        std::printf("2^%-4ld %-7ld %-11s %12.3f %9.2f %14.2f %8.0f%%\n", static_cast<long>(log2),
                    static_cast<long>(t), mixed ? "bf16+copy" : "fp32",
                    static_cast<double>(n) / s / 1e9, gbs, limit, 100.0 * gbs / limit);
      }
    }
  }
  // The peer, when installed: torch.optim.Adam(foreach=True) on the same sizes.
  if (std::system("python3 -c 'import torch' >/dev/null 2>&1") == 0) {
    for (int64_t log2 : sizes) {
      for (int64_t t : threads) {
        const std::string cmd =
            "python3 -c \"import torch,time; torch.set_num_threads(" + std::to_string(t) +
            "); n=1<<" + std::to_string(log2) +
            "; p=torch.nn.Parameter(torch.zeros(n)); p.grad=torch.full((n,),0.01); "
            "o=torch.optim.Adam([p],foreach=True); o.step(); b=1e9\n"
            "for _ in range(5):\n s=time.perf_counter(); o.step(); b=min(b,time.perf_counter()-s)\n"
            "print(f'torch 2^" +
            std::to_string(log2) + " threads " + std::to_string(t) +
            ": {n/b/1e9:.3f} Gparams/s')\"";
        if (std::system(cmd.c_str()) != 0) std::printf("torch: run failed\n");
      }
    }
  } else {
    std::printf(
        "torch.optim.Adam: not installed here (apt-get install python3-torch to compare)\n");
  }
  return 0;
}
