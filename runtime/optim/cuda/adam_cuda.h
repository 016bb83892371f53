#ifndef ZEROD_RUNTIME_OPTIM_CUDA_ADAM_CUDA_H_
#define ZEROD_RUNTIME_OPTIM_CUDA_ADAM_CUDA_H_

// Device kernels of the optimizer step, for shards in GPU memory (plain cudaMalloc):
// - a fused multi-tensor Adam/AdamW: the CPU kernel's formula and order of operations (no fused
//   multiply-add), reading fp32/bf16/fp16 gradients, updating master, m and v and writing the
//   low-precision copy in one pass, with 16-byte loads;
// - unscale with a non-finite check, squared-norm partial sums for global clipping, dtype casts.
// All run on the given stream and return without synchronising.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/optim/adam.h"

namespace zerod::optim::cuda {

// Launches Adam over every run, each with its own scalars (device pointers; the runs of one call
// share their gradient and copy dtypes). A run whose streams are 16-byte aligned (8 bytes for
// 16-bit gradients) is read four elements at a time, any other element by element; the results
// are the same. At most kMaxShardsPerLaunch runs per launch; more are split.
inline constexpr int kMaxShardsPerLaunch = 32;
absl::Status AdamStep(const std::vector<AdamRun>& runs, cudaStream_t stream);
// Every shard with the same scalars.
absl::Status AdamStep(const std::vector<AdamShard>& shards, const AdamScalars& scalars,
                      cudaStream_t stream);

// grad *= scale in place; sets *found_nonfinite (device int, zeroed by the caller) when any
// element is inf or NaN.
absl::Status UnscaleAndCheck(void* grad, DType dtype, int64_t numel, float scale,
                             int* found_nonfinite, cudaStream_t stream);

// Writes per-block partial sums of squares of `numel` elements into `partials` (device, at
// least SquaredNormBlocks(numel) floats); the caller adds them up.
int SquaredNormBlocks(int64_t numel);
absl::Status SquaredNormPartials(const void* data, DType dtype, int64_t numel, float* partials,
                                 cudaStream_t stream);

// dst[i] += src[i] with `src` fp32 (AddFloat) or `dtype` like dst (AddSame), rounding to dtype.
absl::Status AddFloat(void* dst, DType dtype, const float* src, int64_t numel, cudaStream_t stream);
absl::Status AddSame(void* dst, DType dtype, const void* src, int64_t numel, cudaStream_t stream);

// dst[i] = src[i] converted between fp32, bf16 and fp16 (round to nearest even).
absl::Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t numel,
                  cudaStream_t stream);

}  // namespace zerod::optim::cuda

#endif  // ZEROD_RUNTIME_OPTIM_CUDA_ADAM_CUDA_H_
