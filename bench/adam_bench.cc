// adam_bench: the optimizer step on 2^24 and 2^26 parameters with 1 and 2 threads, for each
// vector ISA this CPU runs (AVX2, and AVX-512 where present: the AVX2 kernel is measured there
// too), in parameters/s and effective GB/s, each beside the memory limit measured in the same run
// with the same access pattern (the same bytes read and written, in place, with trivial arithmetic
// and the kernels' prefetching): fp32 (read p, g, m, v; write p, m, v: 28 bytes a parameter), and
// bf16 and fp16 gradients with the copy of that dtype (16-bit g read and 16-bit copy written: 26
// bytes). The two limits differ: the copy is a store to lines not otherwise read, which the core
// reads first (write-allocate), so the 16-bit pattern moves more than the 26 bytes it counts.
// The "groups" rows run the same step as the model's tensors with two parameter groups (weights
// with weight decay, biases and norms without, as GPT recipes have them): the elements cut into
// the runs of a GPT-2 layer's tensors, alternating between two sets of scalars, so the cost of
// per-group hyperparameters shows beside the single run. Beside torch.optim.Adam (foreach) when
// python3-torch is installed.
//
//   build/bin/adam_bench [--sizes 24,26] [--threads 1,2] [--repeat 5] [--isa avx2,avx512]
//
// Each repetition times every limit and every step one after the other and the best of each
// counts, so that a busy moment on a shared machine slows both sides of a ratio alike.

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/optim/adam.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace zerod;

double Seconds(const std::function<void()>& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The kernels prefetch these streams 1 KiB ahead, one prefetch per 64-byte line; the limit does
// the same, so it stays a limit.
inline void Prefetch(const float* p, const float* m, const float* v, int64_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(p + i + 256), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(m + i + 256), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(v + i + 256), _MM_HINT_T0);
}

// The fp32 pattern with nothing to compute: p += g, m += g, v += g, 16 (AVX2) or 32 (AVX-512)
// elements an iteration as the kernels go.
__attribute__((target("avx512f"))) void PatternAvx512(float* p, const float* g, float* m, float* v,
                                                      int64_t b, int64_t e) {
  for (int64_t i = b; i + 32 <= e; i += 32) {
    Prefetch(p, m, v, i);
    Prefetch(p, m, v, i + 16);
    for (int64_t j = i; j < i + 32; j += 16) {
      const __m512 x = _mm512_loadu_ps(g + j);
      _mm512_storeu_ps(p + j, _mm512_add_ps(_mm512_loadu_ps(p + j), x));
      _mm512_storeu_ps(m + j, _mm512_add_ps(_mm512_loadu_ps(m + j), x));
      _mm512_storeu_ps(v + j, _mm512_add_ps(_mm512_loadu_ps(v + j), x));
    }
  }
}
__attribute__((target("avx2"))) void PatternAvx2(float* p, const float* g, float* m, float* v,
                                                 int64_t b, int64_t e) {
  for (int64_t i = b; i + 16 <= e; i += 16) {
    Prefetch(p, m, v, i);
    for (int64_t j = i; j < i + 16; j += 8) {
      const __m256 x = _mm256_loadu_ps(g + j);
      _mm256_storeu_ps(p + j, _mm256_add_ps(_mm256_loadu_ps(p + j), x));
      _mm256_storeu_ps(m + j, _mm256_add_ps(_mm256_loadu_ps(m + j), x));
      _mm256_storeu_ps(v + j, _mm256_add_ps(_mm256_loadu_ps(v + j), x));
    }
  }
}

// The 16-bit pattern: the same, with 16-bit gradients widened by a shift and the top half of the
// new p written as the 16-bit copy.
__attribute__((target("avx512f,avx512bw"))) void PatternHalfAvx512(float* p, const uint16_t* g,
                                                                   float* m, float* v,
                                                                   uint16_t* low, int64_t b,
                                                                   int64_t e) {
  for (int64_t i = b; i + 32 <= e; i += 32) {
    Prefetch(p, m, v, i);
    Prefetch(p, m, v, i + 16);
    for (int64_t j = i; j < i + 32; j += 16) {
      const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + j))), 16));
      const __m512 np = _mm512_add_ps(_mm512_loadu_ps(p + j), x);
      _mm512_storeu_ps(p + j, np);
      _mm512_storeu_ps(m + j, _mm512_add_ps(_mm512_loadu_ps(m + j), x));
      _mm512_storeu_ps(v + j, _mm512_add_ps(_mm512_loadu_ps(v + j), x));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + j),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(np), 16)));
    }
  }
}
__attribute__((target("avx2"))) void PatternHalfAvx2(float* p, const uint16_t* g, float* m,
                                                     float* v, uint16_t* low, int64_t b,
                                                     int64_t e) {
  for (int64_t i = b; i + 16 <= e; i += 16) {
    Prefetch(p, m, v, i);
    for (int64_t j = i; j < i + 16; j += 8) {
      const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + j))), 16));
      const __m256 np = _mm256_add_ps(_mm256_loadu_ps(p + j), x);
      _mm256_storeu_ps(p + j, np);
      _mm256_storeu_ps(m + j, _mm256_add_ps(_mm256_loadu_ps(m + j), x));
      _mm256_storeu_ps(v + j, _mm256_add_ps(_mm256_loadu_ps(v + j), x));
      const __m256i h = _mm256_srli_epi32(_mm256_castps_si256(np), 16);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(low + j),
                       _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    }
  }
}

[[noreturn]] void Usage(const std::string& problem) {
  std::fprintf(stderr, "adam_bench: %s\n", problem.c_str());
  std::exit(2);
}

// A comma-separated list of integers in [lo, hi], or exit 2 naming the flag.
std::vector<int64_t> ParseList(const char* flag, const char* text, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < lo || v > hi) {
      Usage(std::string(flag) + " '" + text + "': expected integers from " + std::to_string(lo) +
            " to " + std::to_string(hi) + ", comma-separated");
    }
    out.push_back(v);
  }
  return out;
}

// --isa: names of vector ISAs this CPU runs; by default all of them.
std::vector<optim::Isa> ParseIsas(const char* text) {
  std::vector<optim::Isa> available, out;
  std::vector<std::string> names;
  for (optim::Isa isa : optim::AvailableIsas()) {
    if (isa == optim::Isa::kScalar) continue;
    available.push_back(isa);
    names.emplace_back(optim::IsaName(isa));
  }
  if (available.empty()) Usage("this CPU has neither AVX2 (with FMA and F16C) nor AVX-512");
  if (text == nullptr) return available;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    auto it = std::find_if(available.begin(), available.end(), [&](optim::Isa isa) {
      return optim::IsaName(isa) == std::string_view(part.data(), part.size());
    });
    if (it == available.end()) {
      Usage("--isa '" + std::string(part) +
            "': not a vector ISA this CPU runs (available: " + absl::StrJoin(names, ",") + ")");
    }
    out.push_back(*it);
  }
  return out;
}

// The step's rows: a gradient dtype and the copy, if any, with the bytes each parameter moves;
// `groups`: the elements as a GPT layer's tensors in two parameter groups.
struct Variant {
  const char* name;
  DType grad;
  bool copy;  // a low-precision copy of the gradient's dtype
  double bytes;
  bool groups;
};
constexpr Variant kVariants[] = {{"fp32", DType::kFloat32, false, 28.0, false},
                                 {"fp32 groups", DType::kFloat32, false, 28.0, true},
                                 {"bf16+copy", DType::kBFloat16, true, 26.0, false},
                                 {"bf16 groups", DType::kBFloat16, true, 26.0, true},
                                 {"fp16+copy", DType::kFloat16, true, 26.0, false}};

// `whole` cut into GPT-2 (d = 768) layers' tensors, repeated to its end: attention qkv, proj,
// MLP fc, proj (weights in group 0, with weight decay; their biases and the two LayerNorms' in
// group 1), each run with its group's scalars.
std::vector<optim::AdamRun> GptRuns(const optim::AdamShard& whole, int64_t step) {
  constexpr int64_t d = 768;
  const int64_t layer[] = {3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d, d, d};
  const bool decayed[] = {true, false, true, false, false, false,
                          true, false, true, false, false, false};
  const optim::AdamScalars k[] = {
      optim::MakeAdamScalars(optim::AdamConfig{3e-4, 0.9, 0.95, 1e-8, 0.1, true}, step),
      optim::MakeAdamScalars(optim::AdamConfig{3e-4, 0.9, 0.95, 1e-8, 0.0, true}, step)};
  const int64_t grad_bytes = DTypeBytes(whole.grad_dtype);
  std::vector<optim::AdamRun> runs;
  for (int64_t at = 0, t = 0; at < whole.numel; ++t) {
    const size_t j = static_cast<size_t>(t % 12);
    optim::AdamShard part = whole;
    part.param += at;
    part.exp_avg += at;
    part.exp_avg_sq += at;
    part.grad = static_cast<const char*>(whole.grad) + at * grad_bytes;
    if (whole.low_precision != nullptr) {
      part.low_precision = static_cast<uint16_t*>(whole.low_precision) + at;
    }
    part.numel = std::min(layer[j], whole.numel - at);
    runs.push_back({part, k[decayed[j] ? 0 : 1]});
    at += part.numel;
  }
  return runs;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {24, 26}, threads = {1, 2};
  int64_t repeat = 5;
  const char* isa_flag = nullptr;
  for (int i = 1; i < argc; i += 2) {
    const char* flag = argv[i];
    if (i + 1 >= argc) Usage(std::string(flag) + ": missing value");
    const char* value = argv[i + 1];
    if (!std::strcmp(flag, "--sizes")) {
      sizes = ParseList(flag, value, 10, 30);
    } else if (!std::strcmp(flag, "--threads")) {
      threads = ParseList(flag, value, 1, 1024);
    } else if (!std::strcmp(flag, "--repeat")) {
      const std::vector<int64_t> list = ParseList(flag, value, 1, 1000);
      if (list.size() != 1) Usage(std::string(flag) + " '" + value + "': expected one integer");
      repeat = list[0];
    } else if (!std::strcmp(flag, "--isa")) {
      isa_flag = value;
    } else {
      Usage(std::string("unknown flag ") + flag + " (--sizes, --threads, --repeat, --isa)");
    }
  }
  const std::vector<optim::Isa> isas = ParseIsas(isa_flag);
  std::vector<std::string> isa_names;
  for (optim::Isa isa : isas) isa_names.emplace_back(optim::IsaName(isa));
  std::printf(
      "adam_bench: kernels %s; bytes/param: fp32 28 (p,g,m,v read; p,m,v written), 16-bit grads + "
      "16-bit copy 26; each against the same-pattern limit; best of %ld\n",
      absl::StrJoin(isa_names, ", ").c_str(), static_cast<long>(repeat));
  std::printf("%-7s %-6s %-7s %-12s %10s %8s %11s %9s\n", "isa", "size", "threads", "grads",
              "Gparams/s", "GB/s", "limit GB/s", "of limit");
  for (int64_t log2 : sizes) {
    const int64_t n = int64_t{1} << log2;
    std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    // 0x3c00: 1.0 as fp16, 2^-7 as bf16.
    std::vector<uint16_t> g16(n, 0x3c00), low(n, 0);
    for (int64_t t : threads) {
      ThreadPool pool(static_cast<int>(t));
      for (optim::Isa isa : isas) {
        const bool avx512 = isa == optim::Isa::kAvx512;
        auto limit32 = [&] {
          pool.ParallelFor(n, 64, [&](int64_t b, int64_t e) {
            avx512 ? PatternAvx512(p.data(), g.data(), m.data(), v.data(), b, e)
                   : PatternAvx2(p.data(), g.data(), m.data(), v.data(), b, e);
          });
        };
        auto limit16 = [&] {
          pool.ParallelFor(n, 64, [&](int64_t b, int64_t e) {
            avx512 ? PatternHalfAvx512(p.data(), g16.data(), m.data(), v.data(), low.data(), b, e)
                   : PatternHalfAvx2(p.data(), g16.data(), m.data(), v.data(), low.data(), b, e);
          });
        };
        double best_limit32 = 1e30, best_limit16 = 1e30;
        double best_step[std::size(kVariants)];
        std::fill(std::begin(best_step), std::end(best_step), 1e30);
        int64_t step = 0;
        for (int64_t r = 0; r < repeat; ++r) {
          best_limit32 = std::min(best_limit32, Seconds(limit32));
          best_limit16 = std::min(best_limit16, Seconds(limit16));
          for (size_t j = 0; j < std::size(kVariants); ++j) {
            const Variant& variant = kVariants[j];
            optim::AdamShard shard;
            shard.param = p.data();
            shard.exp_avg = m.data();
            shard.exp_avg_sq = v.data();
            shard.numel = n;
            shard.grad_dtype = variant.grad;
            shard.grad = variant.grad == DType::kFloat32 ? static_cast<const void*>(g.data())
                                                         : static_cast<const void*>(g16.data());
            if (variant.copy) {
              shard.low_precision = low.data();
              shard.low_precision_dtype = variant.grad;
            }
            const optim::AdamScalars k = optim::MakeAdamScalars(optim::AdamConfig{}, ++step);
            if (variant.groups) {
              const std::vector<optim::AdamRun> runs = GptRuns(shard, step);
              best_step[j] =
                  std::min(best_step[j], Seconds([&] { optim::AdamStep(runs, isa, &pool); }));
            } else {
              best_step[j] =
                  std::min(best_step[j], Seconds([&] { optim::AdamStep(shard, k, isa, &pool); }));
            }
          }
        }
        for (size_t j = 0; j < std::size(kVariants); ++j) {
          const Variant& variant = kVariants[j];
          const double per_param = static_cast<double>(n) / 1e9;
          const double limit =
              variant.bytes * per_param / (variant.copy ? best_limit16 : best_limit32);
          const double gbs = variant.bytes * per_param / best_step[j];
          std::printf("%-7s 2^%-4ld %-7ld %-12s %10.3f %8.2f %11.2f %8.0f%%\n",
                      std::string(optim::IsaName(isa)).c_str(), static_cast<long>(log2),
                      static_cast<long>(t), variant.name, per_param / best_step[j], gbs, limit,
                      100.0 * gbs / limit);
        }
      }
    }
  }
  // The peer, when installed: torch.optim.Adam(foreach=True) on the same sizes, from Debian's
  // /usr/bin/python3 (python3-torch) or else the python3 on the PATH (a GPU machine's).
  const char* python = nullptr;
  for (const char* candidate : {"/usr/bin/python3", "python3"}) {
    const std::string probe = std::string(candidate) + " -c 'import torch' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python != nullptr) {
    for (int64_t log2 : sizes) {
      for (int64_t t : threads) {
        const std::string cmd =
            std::string(python) + " -c \"import torch,time; torch.set_num_threads(" +
            std::to_string(t) + "); n=1<<" + std::to_string(log2) +
            "; p=torch.nn.Parameter(torch.zeros(n)); p.grad=torch.full((n,),0.01); "
            "o=torch.optim.Adam([p],foreach=True); o.step(); b=1e9\n"
            "for _ in range(5):\n s=time.perf_counter(); o.step(); b=min(b,time.perf_counter()-s)\n"
            "print(f'torch 2^" +
            std::to_string(log2) + " threads " + std::to_string(t) +
            ": {n/b/1e9:.3f} Gparams/s')\"";
        std::fflush(stdout);  // our lines first, then the child's
        if (std::system(cmd.c_str()) != 0) std::printf("torch: run failed\n");
      }
    }
  } else {
    std::printf(
        "torch.optim.Adam: not installed here (apt-get install python3-torch to compare)\n");
  }
  return 0;
}
