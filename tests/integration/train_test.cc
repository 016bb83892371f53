// Real training: train_mlp ranks under a real zerod, launched by zerorun or directly, against the
// unsharded reference run; a killed rank; zerorun's own contract.

#include <signal.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The last line carrying train_mlp's summary (possibly behind zerorun's "[rank 0] " prefix).
json LastJson(const std::string& out) {
  size_t end = out.size();
  while (end > 0) {
    const size_t begin = out.rfind('\n', end - 1);
    const size_t start = begin == std::string::npos ? 0 : begin + 1;
    const std::string line = out.substr(start, end - start);
    const size_t brace = line.find('{');
    if (brace != std::string::npos && line.find("\"final_loss\"") != std::string::npos) {
      return json::parse(line.substr(brace));
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  ADD_FAILURE() << "no summary line in: " << out;
  return json::object();
}

json Reference(int64_t world, const std::string& dtype, int64_t steps) {
  const ProcessResult r =
      RunProcess({TRAIN_MLP_PATH, "--reference", "--world", std::to_string(world), "--dtype", dtype,
                  "--steps", std::to_string(steps), "--seed", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return LastJson(r.out);
}

TEST(Train, EveryStageEndsWhereTheUnshardedRunEnds) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  for (const std::string dtype : {"fp32", "bf16"}) {
    const json reference = Reference(3, dtype, 4);
    const double want = reference["final_loss"].get<double>();
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string job = absl::StrCat("train-", dtype, "-", stage);
      const ProcessResult r =
          RunProcess({ZERORUN_PATH, "-n", "3", "--endpoint", zerod.endpoint(), "--job", job, "--",
                      TRAIN_MLP_PATH, "--stage", std::to_string(stage), "--dtype", dtype, "--steps",
                      "4", "--seed", "3"});
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
      EXPECT_THAT(r.out, HasSubstr("[rank 2] step 4 loss"));
      const json out = LastJson(r.out);
      const double got = out["final_loss"].get<double>();
      // fp32: another reduction order; bf16: 16-bit sums in another order.
      const double tolerance = dtype == "fp32" ? 1e-5 : 2e-2;
      EXPECT_NEAR(got, want, tolerance * want) << job;
      EXPECT_EQ(out["stage"], stage);
      EXPECT_LE(out["model_state_bytes_per_rank"].get<int64_t>(),
                reference["model_state_bytes_per_rank"].get<int64_t>());
      // The job's members reported the plan's memory while they trained.
      const ProcessResult memory = zerod.Zeroctl({"memory", job, "--json"});
      ASSERT_EQ(memory.exit_code, 0) << memory.err;
      const json report = json::parse(memory.out);
      for (const json& rank : report["ranks"]) {
        EXPECT_EQ(rank["plan_total_bytes"], rank["reported_total_bytes"]) << job;
      }
    }
  }
}

TEST(Train, AKilledRankReleasesTheOthersWithAnErrorNamingIt) {
  ZerodHarness zerod({"--lease-ttl", "1s", "--restart-grace", "1s"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{TRAIN_MLP_PATH, "--stage", "2", "--steps", "100000"},
        zerod.dir().path() + "/rank" + std::to_string(r) + ".log",
        std::vector<std::string>{"ZEROD_ENDPOINT=" + zerod.endpoint(), "ZEROD_JOB=killed",
                                 "ZEROD_RANK=" + std::to_string(r), "ZEROD_WORLD_SIZE=3"}));
  }
  // Wait until training runs, then kill rank 1 as a crash would.
  for (int i = 0; i < 400 && ranks[0]->Output().find("step 3 ") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_THAT(ranks[0]->Output(), HasSubstr("step 3 "));
  const absl::Time killed = absl::Now();
  ranks[1]->Signal(SIGKILL);
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks[r]->Wait(absl::Seconds(20)), 1) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("rank 1 was lost")) << ranks[r]->Output();
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10)) << "released within about the lease TTL";
}

TEST(Zerorun, PrefixesOutputSetsTheEnvironmentAndPropagatesFailure) {
  const ProcessResult ok = RunProcess(
      {ZERORUN_PATH, "-n", "2", "--endpoint", "unix:///nowhere", "--job", "env", "--", "sh", "-c",
       "echo $ZEROD_RANK/$ZEROD_WORLD_SIZE $ZEROD_JOB $ZEROD_ENDPOINT; echo oops >&2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("[rank 0] 0/2 env unix:///nowhere"));
  EXPECT_THAT(ok.out, HasSubstr("[rank 1] 1/2 env unix:///nowhere"));
  EXPECT_THAT(ok.err, HasSubstr("[rank 1] oops"));
  // Rank 1 fails with 3 while rank 0 would run for a minute: zerorun stops it and exits 3.
  const absl::Time start = absl::Now();
  const ProcessResult failed =
      RunProcess({ZERORUN_PATH, "-n", "2", "--endpoint", "unix:///nowhere", "--", "sh", "-c",
                  "if [ $ZEROD_RANK = 1 ]; then exit 3; fi; sleep 60"});
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_THAT(failed.err, HasSubstr("rank 1 exited with code 3"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // Usage errors.
  EXPECT_EQ(RunProcess({ZERORUN_PATH, "-n", "0", "--endpoint", "x", "--", "true"}).exit_code, 2);
  EXPECT_EQ(RunProcess({ZERORUN_PATH, "-n", "2", "--endpoint", "x"}).exit_code, 2);
}

}  // namespace
}  // namespace zerod::testing
