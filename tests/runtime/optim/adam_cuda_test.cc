// The CUDA optimizer kernels against the CPU kernels on the same inputs (label gpu: skipped
// without a device).

#include "runtime/optim/cuda/adam_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/half.h"
#include "runtime/optim/adam.h"

namespace zerod::optim {
namespace {

bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!HaveDevice()) GTEST_SKIP() << "skipped: no CUDA device"

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, host.size() * sizeof(T) + 16), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(AdamCuda, MatchesTheCpuKernelBitwise) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType grad_dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (bool adamw : {false, true}) {
      const std::vector<int64_t> sizes = {1000, 4, 65536 + 4, 13};  // last one has a tail
      std::vector<std::vector<float>> p, m, v, g32;
      std::vector<std::vector<uint16_t>> g16, low;
      for (int64_t n : sizes) {
        p.emplace_back(n);
        m.emplace_back(n);
        v.emplace_back(n);
        g32.emplace_back(n);
        g16.emplace_back(n);
        low.emplace_back(n, 0);
        for (int64_t i = 0; i < n; ++i) {
          p.back()[i] = normal(rng);
          m.back()[i] = normal(rng) * 0.1f;
          v.back()[i] = std::fabs(normal(rng)) * 0.01f;
          g32.back()[i] = normal(rng);
          g16.back()[i] = grad_dtype == DType::kFloat16 ? FloatToFp16(g32.back()[i])
                                                        : FloatToBf16(g32.back()[i]);
        }
      }
      const AdamScalars k = MakeAdamScalars({1e-2, 0.9, 0.99, 1e-8, 0.01, adamw}, 4, 0.5f);
      std::vector<AdamShard> device;
      std::vector<float*> dp, dm, dv;
      std::vector<uint16_t*> dlow;
      for (size_t s = 0; s < sizes.size(); ++s) {
        AdamShard d;
        dp.push_back(ToDevice(p[s]));
        dm.push_back(ToDevice(m[s]));
        dv.push_back(ToDevice(v[s]));
        dlow.push_back(ToDevice(low[s]));
        d.param = dp.back();
        d.exp_avg = dm.back();
        d.exp_avg_sq = dv.back();
        d.grad = grad_dtype == DType::kFloat32 ? static_cast<const void*>(ToDevice(g32[s]))
                                               : static_cast<const void*>(ToDevice(g16[s]));
        d.grad_dtype = grad_dtype;
        d.low_precision = dlow.back();
        d.low_precision_dtype = DType::kBFloat16;
        d.numel = sizes[s];
        device.push_back(d);
      }
      ASSERT_TRUE(cuda::AdamStep(device, k, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (size_t s = 0; s < sizes.size(); ++s) {
        AdamShard host;
        host.param = p[s].data();
        host.exp_avg = m[s].data();
        host.exp_avg_sq = v[s].data();
        host.grad = grad_dtype == DType::kFloat32 ? static_cast<const void*>(g32[s].data())
                                                  : static_cast<const void*>(g16[s].data());
        host.grad_dtype = grad_dtype;
        host.low_precision = low[s].data();
        host.low_precision_dtype = DType::kBFloat16;
        host.numel = sizes[s];
        AdamStep(host, k, Isa::kScalar);
        const size_t n = static_cast<size_t>(sizes[s]);
        EXPECT_EQ(ToHost(dp[s], n), p[s]) << DTypeName(grad_dtype) << " shard " << s;
        EXPECT_EQ(ToHost(dm[s], n), m[s]);
        EXPECT_EQ(ToHost(dv[s], n), v[s]);
        EXPECT_EQ(ToHost(dlow[s], n), low[s]);
        cudaFree(dp[s]);
        cudaFree(dm[s]);
        cudaFree(dv[s]);
        cudaFree(dlow[s]);
        cudaFree(const_cast<void*>(device[s].grad));
      }
    }
  }
}

// Runs with their own scalars, cut from one buffer at every alignment (a tensor boundary falls
// anywhere in a slice), more than one launch holds: each gives the CPU kernel's bits on that run.
TEST(AdamCuda, RunsWithTheirOwnScalarsAtAnyAlignmentMatchTheCpuKernel) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int64_t> lengths;
  for (int64_t n = 1; n <= 40; ++n) lengths.push_back(n);
  lengths.push_back(5000);
  lengths.push_back(70001);
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  const AdamScalars groups[] = {MakeAdamScalars({1e-2, 0.9, 0.99, 1e-8, 0.1, true}, 3, 0.5f),
                                MakeAdamScalars({3e-2, 0.8, 0.95, 1e-6, 0.0, true}, 2, 0.5f),
                                MakeAdamScalars({1e-3, 0.9, 0.999, 1e-8, 0.01, false}, 1, 0.5f)};
  for (DType grad_dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::vector<float> p(total), m(total), v(total), g32(total);
    std::vector<uint16_t> g16(total), low(total, 0);
    for (int64_t i = 0; i < total; ++i) {
      p[i] = normal(rng);
      m[i] = normal(rng) * 0.1f;
      v[i] = std::fabs(normal(rng)) * 0.01f;
      g32[i] = normal(rng);
      g16[i] = FloatToBf16(g32[i]);
    }
    float* dp = ToDevice(p);
    float* dm = ToDevice(m);
    float* dv = ToDevice(v);
    uint16_t* dlow = ToDevice(low);
    const void* dg = grad_dtype == DType::kFloat32 ? static_cast<const void*>(ToDevice(g32))
                                                   : static_cast<const void*>(ToDevice(g16));
    std::vector<AdamRun> device, host;
    int64_t at = 0;
    for (size_t r = 0; r < lengths.size(); ++r) {
      const AdamScalars& k = groups[r % 3];
      const int64_t bytes = DTypeBytes(grad_dtype);
      const void* hg = grad_dtype == DType::kFloat32 ? static_cast<const void*>(g32.data())
                                                     : static_cast<const void*>(g16.data());
      device.push_back({{dp + at, dm + at, dv + at, static_cast<const char*>(dg) + at * bytes,
                         grad_dtype, dlow + at, DType::kBFloat16, lengths[r]},
                        k});
      host.push_back(
          {{p.data() + at, m.data() + at, v.data() + at, static_cast<const char*>(hg) + at * bytes,
            grad_dtype, low.data() + at, DType::kBFloat16, lengths[r]},
           k});
      at += lengths[r];
    }
    ASSERT_TRUE(cuda::AdamStep(device, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const AdamRun& run : host) AdamStep(run.shard, run.scalars, Isa::kScalar);
    const size_t n = static_cast<size_t>(total);
    EXPECT_EQ(ToHost(dp, n), p) << DTypeName(grad_dtype);
    EXPECT_EQ(ToHost(dm, n), m);
    EXPECT_EQ(ToHost(dv, n), v);
    EXPECT_EQ(ToHost(dlow, n), low);
    for (const void* d : {static_cast<const void*>(dp), static_cast<const void*>(dm),
                          static_cast<const void*>(dv), static_cast<const void*>(dlow), dg}) {
      cudaFree(const_cast<void*>(d));
    }
  }
}

TEST(AdamCuda, UnscaleNormAndCast) {
  SKIP_WITHOUT_DEVICE();
  std::vector<float> host(100000);
  double sum = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = static_cast<float>(std::sin(static_cast<double>(i)));
    sum += 0.25 * host[i] * host[i];
  }
  float* d = ToDevice(host);
  int* found = nullptr;
  ASSERT_EQ(cudaMalloc(&found, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(found, 0, sizeof(int)), cudaSuccess);
  ASSERT_TRUE(cuda::UnscaleAndCheck(d, DType::kFloat32, 100000, 0.5f, found, nullptr).ok());
  const int blocks = cuda::SquaredNormBlocks(100000);
  float* partials = nullptr;
  ASSERT_EQ(cudaMalloc(&partials, blocks * sizeof(float)), cudaSuccess);
  ASSERT_TRUE(cuda::SquaredNormPartials(d, DType::kFloat32, 100000, partials, nullptr).ok());
  double got = 0;
  for (float x : ToHost(partials, static_cast<size_t>(blocks))) got += x;
  EXPECT_NEAR(got, sum, 1e-4 * sum);
  EXPECT_EQ(ToHost(found, 1)[0], 0);
  std::vector<float> inf = {1.0f, INFINITY};
  float* di = ToDevice(inf);
  ASSERT_TRUE(cuda::UnscaleAndCheck(di, DType::kFloat32, 2, 1.0f, found, nullptr).ok());
  EXPECT_EQ(ToHost(found, 1)[0], 1);
  uint16_t* bf = nullptr;
  ASSERT_EQ(cudaMalloc(&bf, 100000 * sizeof(uint16_t)), cudaSuccess);
  ASSERT_TRUE(cuda::Cast(d, DType::kFloat32, bf, DType::kBFloat16, 100000, nullptr).ok());
  const std::vector<float> unscaled = ToHost(d, 100000);
  const std::vector<uint16_t> cast = ToHost(bf, 100000);
  for (size_t i = 0; i < cast.size(); ++i) ASSERT_EQ(cast[i], FloatToBf16(unscaled[i]));
  cudaFree(d);
  cudaFree(di);
  cudaFree(found);
  cudaFree(partials);
  cudaFree(bf);
}

}  // namespace
}  // namespace zerod::optim
