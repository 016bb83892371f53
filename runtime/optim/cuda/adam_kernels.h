#ifndef ZEROD_RUNTIME_OPTIM_CUDA_ADAM_KERNELS_H_
#define ZEROD_RUNTIME_OPTIM_CUDA_ADAM_KERNELS_H_

// The device side of adam_cuda.h, in plain types so that nvcc compiles no abseil. dtype codes:
// 0 fp32, 1 bf16, 2 fp16 (runtime/common/dtype.h's values).

#include <cuda_runtime.h>

#include <cstdint>

namespace zerod::optim::cuda::kernels {

struct Scalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias2_sqrt, eps, weight_decay,
      decay_factor, grad_multiplier;
};

struct Shard {
  float* param;
  float* exp_avg;
  float* exp_avg_sq;
  const void* grad;
  void* low;  // may be null
  int64_t numel;
  Scalars k;
  // Every stream is aligned for 16-byte loads of four elements (8 bytes for 16-bit gradients);
  // otherwise each thread steps its four elements one by one.
  int vector;
};

// Kept small enough that a launch's parameters stay within the classic 4 KiB kernel limit.
constexpr int kMaxShards = 32;

struct AdamLaunch {
  Shard shards[kMaxShards];
  int64_t block_start[kMaxShards + 1];  // prefix sums of blocks per shard
  int count;
  int grad_dtype;
  int low_dtype;
};

constexpr int kThreads = 256;
constexpr int kPerThread = 4;  // elements per thread: one 16-byte fp32 load

cudaError_t LaunchAdam(const AdamLaunch& launch, cudaStream_t stream);
cudaError_t LaunchUnscale(void* grad, int dtype, int64_t n, float scale, int* found,
                          cudaStream_t stream);
int NormBlocks(int64_t n);
cudaError_t LaunchSquaredNorm(const void* data, int dtype, int64_t n, float* partials,
                              cudaStream_t stream);
cudaError_t LaunchAddFloat(void* dst, int dtype, const float* src, int64_t n, cudaStream_t stream);
cudaError_t LaunchAddSame(void* dst, int dtype, const void* src, int64_t n, cudaStream_t stream);
cudaError_t LaunchCast(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n,
                       cudaStream_t stream);

}  // namespace zerod::optim::cuda::kernels

#endif  // ZEROD_RUNTIME_OPTIM_CUDA_ADAM_KERNELS_H_
