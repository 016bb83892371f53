// train_mlp with the engine on GPUs (CudaOps buffers, NCCL collectives, a gather communicator on
// its own stream at stage 3) under a real zerod, one rank per visible GPU, against the unsharded
// CPU run (label gpu: skipped without a device).

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;

int Devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

TEST(TrainGpu, EveryStageOnGpusEndsWhereTheUnshardedRunEnds) {
  const int world = Devices();
  if (world == 0) GTEST_SKIP() << "skipped: no CUDA device";
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  for (const std::string dtype : {"fp32", "bf16"}) {
    const ProcessResult ref = RunProcess({Built(TRAIN_MLP_PATH), "--reference", "--world",
                                          std::to_string(world), "--dtype", dtype, "--steps", "4",
                                          "--seed", "3", "--batch", std::to_string(12 * world)});
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    const double want = TrainSummary(ref.out)["final_loss"].get<double>();
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string job = absl::StrCat("gpu-", dtype, "-", stage);
      const ProcessResult r = RunProcess({Built(ZERORUN_PATH),
                                          "-n",
                                          std::to_string(world),
                                          "--endpoint",
                                          zerod.endpoint(),
                                          "--job",
                                          job,
                                          "--",
                                          Built(TRAIN_MLP_PATH),
                                          "--device",
                                          "cuda",
                                          "--stage",
                                          std::to_string(stage),
                                          "--dtype",
                                          dtype,
                                          "--steps",
                                          "4",
                                          "--seed",
                                          "3",
                                          "--batch",
                                          std::to_string(12 * world)});
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      const json out = TrainSummary(r.out);
      EXPECT_EQ(out["device"], "cuda:0");
      EXPECT_EQ(out["gather_communicator"], stage == 3 && world > 1);
      const double tolerance = dtype == "fp32" ? 1e-5 : 2e-2;
      EXPECT_NEAR(out["final_loss"].get<double>(), want, tolerance * want) << job;
      // What the ranks reported is the plan's memory, now on the device.
      const ProcessResult memory = zerod.Zeroctl({"memory", job, "--json"});
      ASSERT_EQ(memory.exit_code, 0) << memory.err;
      for (const json& rank : json::parse(memory.out)["ranks"]) {
        EXPECT_EQ(rank["plan_total_bytes"], rank["reported_total_bytes"]) << job;
      }
    }
  }
}

}  // namespace
}  // namespace zerod::testing
