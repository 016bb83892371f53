// NCCL collectives with one rank per visible GPU (one rank when there is one GPU), checked
// against sums computed here (label gpu: skipped without a device).

#include "runtime/comm/nccl/nccl_communicator.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/in_memory_store.h"

namespace zerod::comm {
namespace {

int Devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

TEST(NcclCommunicator, CollectivesOnEveryVisibleGpu) {
  const int world = Devices();
  if (world == 0) GTEST_SKIP() << "skipped: no CUDA device";
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      auto comm = NcclCommunicator::Create(store, r, world, {r, nullptr, absl::Seconds(60)});
      ASSERT_TRUE(comm.ok()) << comm.status();
      const int64_t chunk = 1001;
      std::vector<float> host(static_cast<size_t>(world * chunk));
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(r + 1) + 0.5f * i;
      float* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, host.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_TRUE(
          (*comm)->AllReduce(d, world * chunk, DType::kFloat32)->Wait(absl::Seconds(60)).ok());
      std::vector<float> out(host.size());
      ASSERT_EQ(cudaMemcpy(out.data(), d, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < out.size(); ++i) {
        double want = 0;
        for (int q = 0; q < world; ++q) want += (q + 1) + 0.5 * i;
        ASSERT_NEAR(out[i], want, 1e-4 * want);
      }
      ASSERT_TRUE((*comm)->ReduceScatter(d, chunk, DType::kFloat32)->Wait(absl::Seconds(60)).ok());
      ASSERT_TRUE((*comm)->AllGather(d, chunk, DType::kFloat32)->Wait(absl::Seconds(60)).ok());
      ASSERT_TRUE((*comm)->Broadcast(d, chunk, DType::kFloat32, 0)->Wait(absl::Seconds(60)).ok());
      ASSERT_TRUE((*comm)->Barrier()->Wait(absl::Seconds(60)).ok());
      EXPECT_EQ((*comm)->BytesSent()["reduce_scatter"], (world - 1) * chunk * 4);
      cudaFree(d);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclCommunicator, AbortReleasesWaiters) {
  if (Devices() == 0) GTEST_SKIP() << "skipped: no CUDA device";
  auto comm = NcclCommunicator::Create(std::make_shared<InMemoryStore>(), 0, 1, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  (*comm)->Abort(absl::UnavailableError("job j: rank 3 was lost"));
  const absl::Status s = (*comm)->Barrier()->Wait(absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zerod::comm
