#include "runtime/optim/cuda/adam_cuda.h"

#include "runtime/common/cuda/cuda_check.h"
#include "runtime/optim/cuda/adam_kernels.h"

namespace zerod::optim::cuda {
namespace {

kernels::Scalars ToDevice(const AdamScalars& k) {
  return {k.beta1, k.one_minus_beta1, k.beta2,        k.one_minus_beta2, k.step_size, k.bias2_sqrt,
          k.eps,   k.weight_decay,    k.decay_factor, k.grad_multiplier};
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

absl::Status AdamStep(const std::vector<AdamRun>& runs, cudaStream_t stream) {
  static_assert(kMaxShardsPerLaunch == kernels::kMaxShards);
  constexpr int64_t kPerBlock = kernels::kThreads * kernels::kPerThread;
  for (size_t first = 0; first < runs.size(); first += kernels::kMaxShards) {
    kernels::AdamLaunch launch{};
    launch.count = 0;
    for (size_t i = first; i < runs.size() && launch.count < kernels::kMaxShards; ++i) {
      const AdamShard& s = runs[i].shard;
      if (i > first && (s.grad_dtype != runs[first].shard.grad_dtype ||
                        s.low_precision_dtype != runs[first].shard.low_precision_dtype)) {
        return absl::InvalidArgumentError("cuda adam: runs of one step must share dtypes");
      }
      const uintptr_t grad_bytes = s.grad_dtype == DType::kFloat32 ? 16 : 8;
      const bool vector = Aligned(s.param, 16) && Aligned(s.exp_avg, 16) &&
                          Aligned(s.exp_avg_sq, 16) && Aligned(s.grad, grad_bytes);
      launch.shards[launch.count] = {s.param,
                                     s.exp_avg,
                                     s.exp_avg_sq,
                                     s.grad,
                                     s.low_precision,
                                     s.numel,
                                     ToDevice(runs[i].scalars),
                                     vector ? 1 : 0};
      launch.block_start[launch.count + 1] =
          launch.block_start[launch.count] + (s.numel + kPerBlock - 1) / kPerBlock;
      ++launch.count;
    }
    launch.grad_dtype = static_cast<int>(runs[first].shard.grad_dtype);
    launch.low_dtype = static_cast<int>(runs[first].shard.low_precision_dtype);
    ZEROD_CUDA_CHECK(kernels::LaunchAdam(launch, stream));
  }
  return absl::OkStatus();
}

absl::Status AdamStep(const std::vector<AdamShard>& shards, const AdamScalars& scalars,
                      cudaStream_t stream) {
  std::vector<AdamRun> runs;
  runs.reserve(shards.size());
  for (const AdamShard& s : shards) runs.push_back({s, scalars});
  return AdamStep(runs, stream);
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
