// ZeroEngine with its buffers on the GPU (CudaOps) and NCCL, one rank per visible GPU, against the
// same training on the CPU runtime (HostOps and Gloo) (label gpu: skipped without a device).

#include <cuda_runtime.h>

#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/nccl/nccl_communicator.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/engine/cuda/cuda_ops.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::engine {
namespace {

int Devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::vector<plan::TensorSpec> Layout() {
  return {{"w0", {64, 96}, DType::kFloat32, ""},
          {"b0", {96}, DType::kFloat32, ""},
          {"w1", {96, 33}, DType::kFloat32, ""},
          {"b1", {33}, DType::kFloat32, ""}};
}

float Init(int64_t t, int64_t i) { return std::sin(static_cast<float>(t * 131 + i)) * 0.3f; }
float Grad(int64_t r, int64_t s, int64_t i, float w) {
  return (0.5f + 0.25f * std::cos(static_cast<float>(r * 7 + s * 3 + i))) *
         (w - std::sin(static_cast<float>(r + s * 5 + i * 0.1)));
}

// Trains 3 steps on `world` ranks; with `gpu`, buffers on GPU r and NCCL, else host and Gloo.
// With `gather_comm`, stage-3 gathers run on a second communicator (its own stream on a GPU).
std::vector<float> Train(int stage, int world, DType dtype, bool gpu, bool gather_comm = false) {
  plan::PlanInput in{Layout(), {}};
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.param_dtype = dtype;
  in.options.grad_dtype = dtype;
  in.options.reduce_bucket_bytes = 4096;
  in.options.gather_unit_bytes = 4096;
  auto plan = std::make_shared<const plan::ShardPlan>(*plan::ShardPlan::Create(in));
  auto store = std::make_shared<comm::InMemoryStore>();
  std::vector<std::vector<float>> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      EngineOptions options;
      options.adam = {1e-2, 0.9, 0.99, 1e-8, 0.0, false};
      std::unique_ptr<comm::Communicator> comm, gathers;
      auto gather_store = std::make_shared<comm::PrefixStore>("gather", store);
      if (gpu) {
        auto ops = CudaOps(r);
        ASSERT_TRUE(ops.ok()) << ops.status();
        options.device = *ops;
        const comm::NcclOptions nccl{r, CudaOpsStream(**ops), absl::Seconds(60)};
        auto c = comm::NcclCommunicator::Create(store, r, world, nccl);
        ASSERT_TRUE(c.ok()) << c.status();
        comm = std::move(*c);
        if (gather_comm) {
          auto g = comm::NcclCommunicator::Create(gather_store, r, world, nccl);
          ASSERT_TRUE(g.ok()) << g.status();
          gathers = std::move(*g);
        }
      } else {
        auto c = comm::GlooCommunicator::Create(store, r, world, {});
        ASSERT_TRUE(c.ok()) << c.status();
        comm = std::move(*c);
        if (gather_comm) {
          auto g = comm::GlooCommunicator::Create(gather_store, r, world, {});
          ASSERT_TRUE(g.ok()) << g.status();
          gathers = std::move(*g);
        }
      }
      options.gather_comm = gathers.get();
      auto e = ZeroEngine::Create(plan, comm.get(), options);
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_EQ((*e)->AllocatedBytes(), plan->AllocatedBytesPerRank());
      ASSERT_TRUE((*e)->InitParameters([](int64_t t, float* p) {
                        for (int64_t i = 0; i < Layout()[t].numel(); ++i) p[i] = Init(t, i);
                      })
                      .ok());
      float* device_grad = nullptr;
      if (gpu) {
        ASSERT_EQ(cudaMalloc(&device_grad, 64 * 96 * sizeof(float)), cudaSuccess);
      }
      for (int64_t s = 1; s <= 3; ++s) {
        for (int64_t t = 3; t >= 0; --t) {
          const int64_t n = Layout()[t].numel();
          std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
          ASSERT_TRUE((*e)->Gather((*e)->UnitOf(t)).ok());
          ASSERT_TRUE((*e)->ParamToFloat(t, w.data()).ok());
          ASSERT_TRUE((*e)->Release((*e)->UnitOf(t)).ok());
          for (int64_t i = 0; i < n; ++i) {
            g[i] = Grad(r, s, t * 10000 + i, w[i]) * static_cast<float>((*e)->loss_scale());
          }
          const float* grad = g.data();
          if (gpu) {
            ASSERT_EQ(cudaMemcpy(device_grad, g.data(), n * 4, cudaMemcpyHostToDevice),
                      cudaSuccess);
            grad = device_grad;
          }
          ASSERT_TRUE((*e)->AccumulateGrad(t, grad).ok());
          if (gpu) {
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // device_grad is reused
          }
        }
        auto step = (*e)->Step();
        ASSERT_TRUE(step.ok()) << step.status();
      }
      auto full = (*e)->FullMasterParameters();
      ASSERT_TRUE(full.ok()) << full.status();
      out[static_cast<size_t>(r)] = *full;
      if (gpu) cudaFree(device_grad);
    });
  }
  for (auto& t : threads) t.join();
  return out[0];
}

TEST(ZeroEngineCuda, EveryStageMatchesTheCpuRuntime) {
  const int world = Devices();
  if (world == 0) GTEST_SKIP() << "skipped: no CUDA device";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(absl::StrCat("stage ", stage, " ", DTypeName(dtype), " on ", world, " GPUs"));
      const std::vector<float> cpu = Train(stage, world, dtype, false);
      const std::vector<float> gpu = Train(stage, world, dtype, true);
      ASSERT_EQ(cpu.size(), gpu.size());
      if (world == 1) {
        EXPECT_EQ(gpu, cpu) << "one rank: the same operations in the same order, bit for bit";
      } else {
        for (size_t i = 0; i < cpu.size(); ++i) {
          ASSERT_NEAR(gpu[i], cpu[i], dtype == DType::kFloat32 ? 1e-5 : 2e-3) << i;
        }
      }
    }
  }
}

TEST(ZeroEngineCuda, StageThreeGathersOnTheirOwnStreamMatchTheCpuRuntime) {
  const int world = Devices();
  if (world == 0) GTEST_SKIP() << "skipped: no CUDA device";
  comm::NcclCommunicator::OrderLaunchesAcrossCommunicators();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " on ", world, " GPUs"));
    const std::vector<float> cpu = Train(3, world, dtype, false, /*gather_comm=*/true);
    const std::vector<float> gpu = Train(3, world, dtype, true, /*gather_comm=*/true);
    const std::vector<float> shared = Train(3, world, dtype, true, /*gather_comm=*/false);
    EXPECT_EQ(gpu, shared) << "where the gathers run changes no number";
    ASSERT_EQ(cpu.size(), gpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_NEAR(gpu[i], cpu[i], dtype == DType::kFloat32 ? 1e-5 : 2e-3) << i;
    }
  }
}

}  // namespace
}  // namespace zerod::engine
