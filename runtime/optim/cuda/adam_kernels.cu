// Device kernels: fused Adam, unscale + non-finite check, squared-norm partials, casts.
// Arithmetic uses the _rn intrinsics so nvcc fuses nothing: the same float operations, in the
// same order, as the CPU kernel (runtime/optim/internal/adam_element.h).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/optim/cuda/adam_kernels.h"

namespace zerod::optim::cuda::kernels {
namespace {

__device__ __forceinline__ float Load(const void* base, int dtype, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(base)[i];
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  return __half2float(static_cast<const __half*>(base)[i]);
}

__device__ __forceinline__ void Store(void* base, int dtype, int64_t i, float x) {
  if (dtype == 0) {
    static_cast<float*>(base)[i] = x;
  } else if (dtype == 1) {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<__half*>(base)[i] = __float2half_rn(x);
  }
}

// Four gradients at element i (i a multiple of 4): one 16-byte load for fp32, 8 bytes for 16-bit.
__device__ __forceinline__ float4 LoadGrad4(const void* g, int dtype, int64_t i) {
  if (dtype == 0) return reinterpret_cast<const float4*>(g)[i / 4];
  const uint2 raw = reinterpret_cast<const uint2*>(g)[i / 4];
  const unsigned short h[4] = {
      static_cast<unsigned short>(raw.x & 0xffff), static_cast<unsigned short>(raw.x >> 16),
      static_cast<unsigned short>(raw.y & 0xffff), static_cast<unsigned short>(raw.y >> 16)};
  float out[4];
  for (int j = 0; j < 4; ++j) {
    out[j] = dtype == 1 ? __bfloat162float(__ushort_as_bfloat16(h[j]))
                        : __half2float(__ushort_as_half(h[j]));
  }
  return make_float4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ void AdamOne(const Scalars& k, float g, float& p, float& m, float& v) {
  g = __fmul_rn(g, k.grad_multiplier);
  p = __fmul_rn(p, k.decay_factor);
  g = __fadd_rn(g, __fmul_rn(k.weight_decay, p));
  m = __fadd_rn(__fmul_rn(m, k.beta1), __fmul_rn(k.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps);
  p = __fadd_rn(p, __fmul_rn(-k.step_size, __fdiv_rn(m, denom)));
}

__global__ void AdamKernel(const AdamLaunch launch) {
  // Which shard this block works on: the last block_start at or below blockIdx.x.
  int s = 0;
  while (s + 1 < launch.count && launch.block_start[s + 1] <= blockIdx.x) ++s;
  const Shard& shard = launch.shards[s];
  const Scalars& k = shard.k;
  const int64_t block = blockIdx.x - launch.block_start[s];
  const int64_t i = (block * kThreads + threadIdx.x) * kPerThread;
  if (i >= shard.numel) return;
  if (shard.vector && i + kPerThread <= shard.numel) {
    const float4 g = LoadGrad4(shard.grad, launch.grad_dtype, i);
    float4 p = reinterpret_cast<float4*>(shard.param)[i / 4];
    float4 m = reinterpret_cast<float4*>(shard.exp_avg)[i / 4];
    float4 v = reinterpret_cast<float4*>(shard.exp_avg_sq)[i / 4];
    AdamOne(k, g.x, p.x, m.x, v.x);
    AdamOne(k, g.y, p.y, m.y, v.y);
    AdamOne(k, g.z, p.z, m.z, v.z);
    AdamOne(k, g.w, p.w, m.w, v.w);
    reinterpret_cast<float4*>(shard.param)[i / 4] = p;
    reinterpret_cast<float4*>(shard.exp_avg)[i / 4] = m;
    reinterpret_cast<float4*>(shard.exp_avg_sq)[i / 4] = v;
    if (shard.low != nullptr) {
      Store(shard.low, launch.low_dtype, i, p.x);
      Store(shard.low, launch.low_dtype, i + 1, p.y);
      Store(shard.low, launch.low_dtype, i + 2, p.z);
      Store(shard.low, launch.low_dtype, i + 3, p.w);
    }
    return;
  }
  // The tail, or a shard that starts between 16-byte boundaries: element by element.
  const int64_t end = i + kPerThread < shard.numel ? i + kPerThread : shard.numel;
  for (int64_t j = i; j < end; ++j) {
    float p = shard.param[j], m = shard.exp_avg[j], v = shard.exp_avg_sq[j];
    AdamOne(k, Load(shard.grad, launch.grad_dtype, j), p, m, v);
    shard.param[j] = p;
    shard.exp_avg[j] = m;
    shard.exp_avg_sq[j] = v;
    if (shard.low != nullptr) Store(shard.low, launch.low_dtype, j, p);
  }
}

__global__ void UnscaleKernel(void* grad, int dtype, int64_t n, float scale, int* found) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = __fmul_rn(Load(grad, dtype, i), scale);
    if (!isfinite(x)) *found = 1;
    Store(grad, dtype, i, x);
  }
}

__global__ void SquaredNormKernel(const void* data, int dtype, int64_t n, float* partials) {
  __shared__ float sums[kThreads];
  float acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = Load(data, dtype, i);
    acc += x * x;
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

__global__ void CastKernel(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(dst, dst_dtype, i, Load(src, src_dtype, i));
  }
}

__global__ void AddFloatKernel(void* dst, int dtype, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(dst, dtype, i, __fadd_rn(Load(dst, dtype, i), src[i]));
  }
}

__global__ void AddSameKernel(void* dst, int dtype, const void* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Store(dst, dtype, i, __fadd_rn(Load(dst, dtype, i), Load(src, dtype, i)));
  }
}

// A grid that fills the device a few times over, for grid-stride loops.
int GridFor(int64_t n) {
  static int sms = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count > 0 ? count : 80;
  }();
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 8 * sms ? (wanted > 0 ? wanted : 1) : 8 * sms);
}

}  // namespace

cudaError_t LaunchAdam(const AdamLaunch& launch, cudaStream_t stream) {
  const int64_t blocks = launch.block_start[launch.count];
  if (blocks == 0) return cudaSuccess;
  AdamKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(launch);
  return cudaGetLastError();
}

cudaError_t LaunchUnscale(void* grad, int dtype, int64_t n, float scale, int* found,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  UnscaleKernel<<<GridFor(n), kThreads, 0, stream>>>(grad, dtype, n, scale, found);
  return cudaGetLastError();
}

int NormBlocks(int64_t n) { return GridFor(n); }

cudaError_t LaunchSquaredNorm(const void* data, int dtype, int64_t n, float* partials,
                              cudaStream_t stream) {
  SquaredNormKernel<<<GridFor(n), kThreads, 0, stream>>>(data, dtype, n, partials);
  return cudaGetLastError();
}

cudaError_t LaunchAddFloat(void* dst, int dtype, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddFloatKernel<<<GridFor(n), kThreads, 0, stream>>>(dst, dtype, src, n);
  return cudaGetLastError();
}

cudaError_t LaunchAddSame(void* dst, int dtype, const void* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddSameKernel<<<GridFor(n), kThreads, 0, stream>>>(dst, dtype, src, n);
  return cudaGetLastError();
}

cudaError_t LaunchCast(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<<<GridFor(n), kThreads, 0, stream>>>(src, src_dtype, dst, dst_dtype, n);
  return cudaGetLastError();
}

}  // namespace zerod::optim::cuda::kernels
