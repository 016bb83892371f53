#include "runtime/optim/cuda/adam_cuda.h"

#include "absl/strings/str_cat.h"
#include "runtime/common/cuda/cuda_check.h"
#include "runtime/optim/cuda/adam_kernels.h"

namespace zerod::optim::cuda {
namespace {

kernels::Scalars ToDevice(const AdamScalars& k) {
  return {k.beta1, k.one_minus_beta1, k.beta2,        k.one_minus_beta2, k.step_size, k.bias2_sqrt,
          k.eps,   k.weight_decay,    k.decay_factor, k.grad_multiplier};
}

}  // namespace

absl::Status AdamStep(const std::vector<AdamShard>& shards, const AdamScalars& scalars,
                      cudaStream_t stream) {
  constexpr int64_t kPerBlock = kernels::kThreads * kernels::kPerThread;
  for (size_t first = 0; first < shards.size(); first += kernels::kMaxShards) {
    kernels::AdamLaunch launch{};
    launch.k = ToDevice(scalars);
    launch.count = 0;
    for (size_t i = first; i < shards.size() && launch.count < kernels::kMaxShards; ++i) {
      const AdamShard& s = shards[i];
      if (i > first && (s.grad_dtype != shards[first].grad_dtype ||
                        s.low_precision_dtype != shards[first].low_precision_dtype)) {
        return absl::InvalidArgumentError("cuda adam: shards of one step must share dtypes");
      }
      if ((reinterpret_cast<uintptr_t>(s.param) | reinterpret_cast<uintptr_t>(s.exp_avg) |
           reinterpret_cast<uintptr_t>(s.exp_avg_sq)) %
              16 !=
          0) {
        return absl::InvalidArgumentError(
            absl::StrCat("cuda adam: shard ", i, " is not 16-byte aligned"));
      }
      launch.shards[launch.count] = {s.param, s.exp_avg,       s.exp_avg_sq,
                                     s.grad,  s.low_precision, s.numel};
      launch.block_start[launch.count + 1] =
          launch.block_start[launch.count] + (s.numel + kPerBlock - 1) / kPerBlock;
      ++launch.count;
    }
    launch.grad_dtype = static_cast<int>(shards[first].grad_dtype);
    launch.low_dtype = static_cast<int>(shards[first].low_precision_dtype);
    ZEROD_CUDA_CHECK(kernels::LaunchAdam(launch, stream));
  }
  return absl::OkStatus();
}

absl::Status UnscaleAndCheck(void* grad, DType dtype, int64_t numel, float scale,
                             int* found_nonfinite, cudaStream_t stream) {
  ZEROD_CUDA_CHECK(
      kernels::LaunchUnscale(grad, static_cast<int>(dtype), numel, scale, found_nonfinite, stream));
  return absl::OkStatus();
}

int SquaredNormBlocks(int64_t numel) { return kernels::NormBlocks(numel); }

absl::Status SquaredNormPartials(const void* data, DType dtype, int64_t numel, float* partials,
                                 cudaStream_t stream) {
  ZEROD_CUDA_CHECK(
      kernels::LaunchSquaredNorm(data, static_cast<int>(dtype), numel, partials, stream));
  return absl::OkStatus();
}

absl::Status AddFloat(void* dst, DType dtype, const float* src, int64_t numel,
                      cudaStream_t stream) {
  ZEROD_CUDA_CHECK(kernels::LaunchAddFloat(dst, static_cast<int>(dtype), src, numel, stream));
  return absl::OkStatus();
}

absl::Status AddSame(void* dst, DType dtype, const void* src, int64_t numel, cudaStream_t stream) {
  ZEROD_CUDA_CHECK(kernels::LaunchAddSame(dst, static_cast<int>(dtype), src, numel, stream));
  return absl::OkStatus();
}

absl::Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t numel,
                  cudaStream_t stream) {
  ZEROD_CUDA_CHECK(kernels::LaunchCast(src, static_cast<int>(src_dtype), dst,
                                       static_cast<int>(dst_dtype), numel, stream));
  return absl::OkStatus();
}

}  // namespace zerod::optim::cuda
