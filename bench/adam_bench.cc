// adam_bench: the optimizer step on 2^24 and 2^26 parameters with 1 and 2 threads, in parameters/s
// and effective GB/s, beside the memory limit measured in the same run with the same access
// pattern (read four streams, write three back in place, trivial arithmetic, prefetching as the
// kernels do), and beside
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

// The kernels prefetch these streams 1 KiB ahead; the limit does the same, so it stays a limit.
inline void Prefetch(const float* p, const float* m, const float* v, int64_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(p + i + 256), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(m + i + 256), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(v + i + 256), _MM_HINT_T0);
}

// The same pattern as Adam with nothing to compute: p += g, m += g, v += g (AVX-512 or AVX2).
__attribute__((target("avx512f"))) void PatternAvx512(float* p, const float* g, float* m, float* v,
                                                      int64_t b, int64_t e) {
  for (int64_t i = b; i + 16 <= e; i += 16) {
    Prefetch(p, m, v, i);
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), x));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), x));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), x));
  }
}
__attribute__((target("avx2"))) void PatternAvx2(float* p, const float* g, float* m, float* v,
                                                 int64_t b, int64_t e) {
  for (int64_t i = b; i + 8 <= e; i += 8) {
    Prefetch(p, m, v, i);
    const __m256 x = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), x));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), x));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), x));
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
        // Both rows against the fp32 pattern's bandwidth: the bf16 step moves fewer bytes, and a
        // 16-bit stream costs no less per byte than a 32-bit one.
        const double limit = limit_gbs;
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
