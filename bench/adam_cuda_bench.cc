// adam_cuda_bench: the fused CUDA Adam step's effective bandwidth beside a device-to-device copy
// measured in the same run (the limit), and the time of one optimizer step for 2^28 parameters.
//
//   build/bin/adam_cuda_bench [--log2 28] [--repeat 20]
//
// Bytes per parameter: fp32 gradients 28 (p, g, m, v read; p, m, v written); bf16 gradients with
// the bf16 copy 26. The copy moves the same number of bytes, read plus written.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/optim/cuda/adam_cuda.h"

namespace {

#define CHECK(call)                                                                    \
  do {                                                                                 \
    const cudaError_t e = (call);                                                      \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "adam_cuda_bench: %s: %s\n", #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (false)

template <typename F>
float BestMs(int repeat, F &&f) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int i = 0; i < repeat; ++i) {
    CHECK(cudaEventRecord(start));
    f();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms);
  }
  return best;
}

}  // namespace

int main(int argc, char **argv) {
  int log2 = 28, repeat = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--log2")) log2 = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("adam_cuda_bench: skipped: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int64_t n = int64_t{1} << log2;
  float *p, *m, *v, *g;
  uint16_t *g16, *low;
  CHECK(cudaMalloc(&p, n * 4));
  CHECK(cudaMalloc(&m, n * 4));
  CHECK(cudaMalloc(&v, n * 4));
  CHECK(cudaMalloc(&g, n * 4));
  CHECK(cudaMalloc(&g16, n * 2));
  CHECK(cudaMalloc(&low, n * 2));
  CHECK(cudaMemset(p, 0, n * 4));
  CHECK(cudaMemset(m, 0, n * 4));
  CHECK(cudaMemset(v, 0, n * 4));
  CHECK(cudaMemset(g, 0, n * 4));
  CHECK(cudaMemset(g16, 0, n * 2));
  // The limit: a device-to-device copy moving 14 bytes per parameter each way (28 in all).
  char *src, *dst;
  const int64_t copy_bytes = n * 14;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  const float copy_ms = BestMs(
      repeat, [&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e6);
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  std::printf(
      "adam_cuda_bench: %s, 2^%d parameters; device-to-device copy %.1f GB/s (read+write)\n",
      prop.name, log2, copy_gbs);
  for (bool mixed : {false, true}) {
    zerod::optim::AdamShard shard;
    shard.param = p;
    shard.exp_avg = m;
    shard.exp_avg_sq = v;
    shard.numel = n;
    shard.grad = mixed ? static_cast<const void *>(g16) : static_cast<const void *>(g);
    shard.grad_dtype = mixed ? zerod::DType::kBFloat16 : zerod::DType::kFloat32;
    shard.low_precision = mixed ? low : nullptr;
    int64_t step = 0;
    const float ms = BestMs(repeat, [&] {
      auto s = zerod::optim::cuda::AdamStep(
          {shard}, zerod::optim::MakeAdamScalars(zerod::optim::AdamConfig{}, ++step), nullptr);
      if (!s.ok()) std::exit(1);
    });
    const double bytes = (mixed ? 26.0 : 28.0) * static_cast<double>(n);
    const double gbs = bytes / (ms * 1e6);
    std::printf("  %-22s step %8.3f ms  %8.1f GB/s  %5.1f%% of copy  %.1f Gparams/s\n",
                mixed ? "bf16 grads + bf16 copy" : "fp32", ms, gbs, 100.0 * gbs / copy_gbs,
                static_cast<double>(n) / (ms * 1e6));
  }
  return 0;
}
