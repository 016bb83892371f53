// train_mlp with the engine on GPUs (CudaOps buffers, NCCL collectives, a gather communicator on
// its own stream at stage 3) under a real zerod, one rank per visible GPU, against the unsharded
// CPU run (label gpu: skipped without a device).

#include <cuda_runtime.h>

#include <string>
#include <vector>

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

// A checkpoint of GPU memory (the engine's state downloaded through CudaOps) resumes on the GPU at
// another stage, and the run ends where the uninterrupted one ends.
TEST(TrainGpu, ACheckpointSavedFromGpuMemoryResumesAtAnotherStageAsIfUninterrupted) {
  const int world = Devices();
  if (world == 0) GTEST_SKIP() << "skipped: no CUDA device";
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir checkpoints;
  auto run = [&](const std::string& job, const std::string& stage, std::vector<std::string> extra) {
    std::vector<std::string> argv = {Built(ZERORUN_PATH),
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
                                     stage,
                                     "--dtype",
                                     "bf16",
                                     "--seed",
                                     "3",
                                     "--batch",
                                     std::to_string(12 * world)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunProcess(argv);
  };
  const ProcessResult whole = run("gpu-whole", "2", {"--steps", "6"});
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const ProcessResult first =
      run("gpu-first", "2",
          {"--steps", "3", "--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "3"});
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  // The job run again (its own records list the checkpoint) at stage 3.
  const ProcessResult resumed =
      run("gpu-first", "3", {"--steps", "6", "--checkpoint-dir", checkpoints.path(), "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from step 3"), std::string::npos) << resumed.out;
  const double want = TrainSummary(whole.out)["final_loss"].get<double>();
  // bf16 parameters; stage 3 gathers what stage 2 all-gathered: the same values, another order.
  EXPECT_NEAR(TrainSummary(resumed.out)["final_loss"].get<double>(), want, 1e-2 * want);
}

}  // namespace
}  // namespace zerod::testing
