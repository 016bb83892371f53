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
using ::testing::Not;

json Reference(int64_t world, const std::string& dtype, int64_t steps) {
  const ProcessResult r =
      RunProcess({TRAIN_MLP_PATH, "--reference", "--world", std::to_string(world), "--dtype", dtype,
                  "--steps", std::to_string(steps), "--seed", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return TrainSummary(r.out);
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
      const json out = TrainSummary(r.out);
      const double got = out["final_loss"].get<double>();
      // fp32: another reduction order; bf16: 16-bit sums in another order.
      const double tolerance = dtype == "fp32" ? 1e-5 : 2e-2;
      EXPECT_NEAR(got, want, tolerance * want) << job;
      EXPECT_EQ(out["stage"], stage);
      // Every rank on one host: stage 3 copies the peers' shards from shared memory.
      EXPECT_EQ(out["shard_exchange"], stage == 3);
      EXPECT_EQ(out["gather_communicator"], false);
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

TEST(Train, StageThreeGathersGiveTheSameRunOnEitherCommunicatorOrFromSharedMemory) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<json> runs;
  for (const bool shared : {false, true}) {
    std::vector<std::string> args = {"/usr/bin/env",
                                     "ZEROD_GLOO_SHARD_EXCHANGE=0",
                                     ZERORUN_PATH,
                                     "-n",
                                     "2",
                                     "--endpoint",
                                     zerod.endpoint(),
                                     "--job",
                                     shared ? "shared" : "own",
                                     "--",
                                     TRAIN_MLP_PATH,
                                     "--stage",
                                     "3",
                                     "--dtype",
                                     "bf16",
                                     "--steps",
                                     "3"};
    if (shared) args.push_back("--shared-gathers");
    const ProcessResult r = RunProcess(args);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    runs.push_back(TrainSummary(r.out));
    EXPECT_EQ(runs.back()["gather_communicator"], !shared);
    EXPECT_EQ(runs.back()["shard_exchange"], false);
  }
  // Gathers only move parameters: where they run changes no number and no byte count.
  EXPECT_EQ(runs[0]["final_loss"], runs[1]["final_loss"]);
  EXPECT_EQ(runs[0]["comm_bytes_by_collective"], runs[1]["comm_bytes_by_collective"]);
  // Pulled from the peers' shards: the same run, with no all-gather at all.
  const ProcessResult r =
      RunProcess({ZERORUN_PATH, "-n", "2", "--endpoint", zerod.endpoint(), "--job", "pulled", "--",
                  TRAIN_MLP_PATH, "--stage", "3", "--dtype", "bf16", "--steps", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json pulled = TrainSummary(r.out);
  EXPECT_EQ(pulled["shard_exchange"], true);
  EXPECT_EQ(pulled["final_loss"], runs[0]["final_loss"]);
  EXPECT_EQ(pulled["comm_bytes_by_collective"]["reduce_scatter"],
            runs[0]["comm_bytes_by_collective"]["reduce_scatter"]);
  EXPECT_FALSE(pulled["comm_bytes_by_collective"].contains("all_gather"));
}

// A trainer switch in the environment: `train` on 2 ranks with `variable`=1, then =0, each run's
// summary checked to report it as `reported`, and the same final loss and bytes counted both
// ways; a value other than 0 or 1 refused with its name. Returns the two summaries.
std::vector<json> SameRunWithSwitchOnOrOff(ZerodHarness& zerod, const std::string& variable,
                                           const std::string& reported,
                                           const std::vector<std::string>& train) {
  std::vector<json> runs;
  for (const char* value : {"1", "0"}) {
    std::vector<std::string> args = {"/usr/bin/env",
                                     absl::StrCat(variable, "=", value),
                                     ZERORUN_PATH,
                                     "-n",
                                     "2",
                                     "--endpoint",
                                     zerod.endpoint(),
                                     "--job",
                                     absl::StrCat(reported, value),
                                     "--",
                                     TRAIN_MLP_PATH};
    args.insert(args.end(), train.begin(), train.end());
    const ProcessResult r = RunProcess(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    if (r.exit_code != 0) return {};
    runs.push_back(TrainSummary(r.out));
    EXPECT_EQ(runs.back()[reported], std::string(value) == "1") << variable << "=" << value;
  }
  EXPECT_EQ(runs[0]["final_loss"], runs[1]["final_loss"]);
  EXPECT_EQ(runs[0]["comm_bytes_by_collective"], runs[1]["comm_bytes_by_collective"]);
  const ProcessResult bad =
      RunProcess({"/usr/bin/env", absl::StrCat(variable, "=yes"), "ZEROD_RANK=0", TRAIN_MLP_PATH,
                  "--endpoint", zerod.endpoint(), "--job", reported + "-bad", "--world", "2"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr(absl::StrCat(variable, "='yes' is not 0 (off) or 1 (on)")));
  return runs;
}

// Through shared memory (ranks of one host, by default) or over TCP ($ZEROD_GLOO_SHARED_MEMORY=0):
// at 2 ranks every sum has two terms, so the same bits either way, and the same bytes counted.
TEST(Train, SharedMemoryOrTcpGiveTheSameRun) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const std::vector<json> runs = SameRunWithSwitchOnOrOff(
      zerod, "ZEROD_GLOO_SHARED_MEMORY", "shared_memory",
      {"--stage", "2", "--dtype", "bf16", "--steps", "3", "--hidden", "256"});
  ASSERT_EQ(runs.size(), 2u);
  // 256 x 256 layers: their gradients and gathers are over the threshold at 2 ranks (64 KiB).
  EXPECT_GT(runs[0]["shared_memory_pieces"].get<int64_t>(), 0);
  EXPECT_EQ(runs[1]["shared_memory_pieces"].get<int64_t>(), 0);
}

// Collectives the engine starts run on the collective thread at once
// ($ZEROD_GLOO_BACKGROUND_START=1) or when the trainer waits for them (=0): the same collectives in
// the same order, so the same run. Stage 3, where prefetches and reduce-scatters are started.
TEST(Train, BackgroundStartOrNotGivesTheSameRun) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  EXPECT_EQ(SameRunWithSwitchOnOrOff(zerod, "ZEROD_GLOO_BACKGROUND_START", "background_start",
                                     {"--stage", "3", "--dtype", "bf16", "--steps", "3"})
                .size(),
            2u);
}

// With every layer's unit live at once, backward finds the units forward gathered: fewer bytes
// all-gathered, the same run (with all-gathers: the shard exchange's pulls are not counted).
TEST(Train, KeepingEveryUnitLiveSavesBackwardsGathersAndChangesNoNumber) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<json> runs;
  for (const char* live : {"2", "4"}) {
    const ProcessResult r = RunProcess({"/usr/bin/env",
                                        "ZEROD_GLOO_SHARD_EXCHANGE=0",
                                        ZERORUN_PATH,
                                        "-n",
                                        "2",
                                        "--endpoint",
                                        zerod.endpoint(),
                                        "--job",
                                        std::string("live") + live,
                                        "--",
                                        TRAIN_MLP_PATH,
                                        "--stage",
                                        "3",
                                        "--layers",
                                        "4",
                                        "--hidden",
                                        "64",
                                        "--steps",
                                        "3",
                                        "--max-live-units",
                                        live});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    runs.push_back(TrainSummary(r.out));
  }
  EXPECT_EQ(runs[0]["final_loss"], runs[1]["final_loss"]);
  EXPECT_EQ(runs[0]["comm_bytes_by_collective"]["reduce_scatter"],
            runs[1]["comm_bytes_by_collective"]["reduce_scatter"]);
  EXPECT_LT(runs[1]["comm_bytes_by_collective"]["all_gather"].get<int64_t>(),
            runs[0]["comm_bytes_by_collective"]["all_gather"].get<int64_t>());
}

TEST(Train, ABadDeviceIsAUsageError) {
  const ProcessResult r = RunProcess({TRAIN_MLP_PATH, "--device", "tpu:0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "train_mlp: --device: expected cpu, cuda or cuda:N, got 'tpu:0'\n");
}

// `world` train_mlp ranks of job `job` at `stage`, each running until stopped, logging under the
// daemon's dir; returns once rank 0 has done `steps` steps. Rank r also gets rank_args[r], if
// any, and every rank the environment `env`.
std::vector<std::unique_ptr<ChildProcess>> StartEndlessRanks(
    ZerodHarness& zerod, const std::string& job, int world, const std::string& stage, int steps,
    const std::vector<std::vector<std::string>>& rank_args = {},
    const std::vector<std::string>& env = {}) {
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {Built(TRAIN_MLP_PATH), "--stage", stage, "--steps", "1000000"};
    if (static_cast<size_t>(r) < rank_args.size()) {
      args.insert(args.end(), rank_args[r].begin(), rank_args[r].end());
    }
    std::vector<std::string> environment = {"ZEROD_ENDPOINT=" + zerod.endpoint(),
                                            "ZEROD_JOB=" + job, "ZEROD_RANK=" + std::to_string(r),
                                            "ZEROD_WORLD_SIZE=" + std::to_string(world)};
    environment.insert(environment.end(), env.begin(), env.end());
    ranks.push_back(std::make_unique<ChildProcess>(
        args, zerod.dir().path() + "/" + job + std::to_string(r) + ".log", environment));
  }
  const std::string marker = absl::StrCat("step ", steps, " ");
  Eventually([&] { return ranks[0]->Output().find(marker) != std::string::npos; },
             absl::Seconds(30));
  EXPECT_THAT(ranks[0]->Output(), HasSubstr(marker));
  return ranks;
}

// A lease the live ranks keep on a loaded machine (2 s, scaled with the build), short enough that a
// lost rank is declared lost soon.
std::vector<std::string> ShortLease() {
  return {"--lease-ttl", ScaledFlag(absl::Seconds(2)), "--restart-grace",
          ScaledFlag(absl::Seconds(1))};
}

void KillOneOfThree(const std::string& stage) {
  ZerodHarness zerod(ShortLease());
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<std::unique_ptr<ChildProcess>> ranks =
      StartEndlessRanks(zerod, "killed", 3, stage, 3);
  ASSERT_THAT(ranks[0]->Output(), HasSubstr("step 3 "));
  // Kill rank 1 as a crash would.
  ranks[1]->Signal(SIGKILL);
  // Released, not hung: Wait gives up (and returns -1) after 20 s (scaled), ten leases: a bound
  // that tells a release from a hang, not a speed.
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks[r]->Wait(absl::Seconds(20)), 1) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("rank 1 was lost")) << ranks[r]->Output();
  }
}

// A kill -9'd rank at stage 2 (one communicator) and stage 3 (a gather communicator too).
TEST(Train, AKilledRankReleasesTheOthersWithAnErrorNamingIt) {
  for (const char* stage : {"2", "3"}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    ASSERT_NO_FATAL_FAILURE(KillOneOfThree(stage));
  }
}

// SIGSTOP, not SIGKILL: the stopped rank keeps its connections open, so nothing but the
// coordinator's word releases the others; Gloo's abort did not interrupt their collectives, which
// stayed in Gloo until the 120 s collective timeout. When the rank resumes (SIGCONT) it must be
// told it was declared lost, not die of SIGPIPE writing to the connections the others closed.
TEST(Train, AStoppedRankIsDeclaredLostReleasesTheOthersAndExitsCleanlyWhenResumed) {
  for (const char* stage : {"2", "3"}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    ZerodHarness zerod(ShortLease());
    ASSERT_NO_FATAL_FAILURE(zerod.Start());
    const std::string job = absl::StrCat("stopped", stage);
    std::vector<std::unique_ptr<ChildProcess>> ranks = StartEndlessRanks(zerod, job, 4, stage, 3);
    ranks[1]->Signal(SIGSTOP);
    // The lease is 2 s; 60 s (scaled) tells a release from a hang on a loaded machine, and stays
    // far from the 120 s collective timeout a hang would end at.
    for (int r : {0, 2, 3}) {
      EXPECT_EQ(ranks[r]->Wait(absl::Seconds(60)), 1) << ranks[r]->Output();
      EXPECT_THAT(ranks[r]->Output(), HasSubstr("rank 1 was lost")) << ranks[r]->Output();
    }
    ranks[1]->Signal(SIGCONT);
    EXPECT_EQ(ranks[1]->Wait(absl::Seconds(30)), 1) << "not 128 + SIGPIPE: " << ranks[1]->Output();
    EXPECT_THAT(ranks[1]->Output(), HasSubstr("rank 1 is not an active member (lost)"))
        << ranks[1]->Output();
  }
}

// A rank whose script ends early calls Leave: the others must not wait for their collective
// timeout, or blame ranks that are alive; they learn from the coordinator which rank left.
TEST(Train, ARankThatLeavesEarlyReleasesTheOthersNamingIt) {
  ZerodHarness zerod(ShortLease());
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<std::unique_ptr<ChildProcess>> ranks =
      StartEndlessRanks(zerod, "leaver", 3, "3", 3, {{}, {"--leave-after", "5"}});
  EXPECT_EQ(ranks[1]->Wait(absl::Seconds(60)), 0) << ranks[1]->Output();
  EXPECT_THAT(ranks[1]->Output(), HasSubstr("rank 1 left the job after step 5"));
  // The others are released at once, not after an order check waiting for the rank that left.
  const absl::Time left = absl::Now();
  for (int r : {0, 2}) {
    EXPECT_EQ(ranks[r]->Wait(absl::Seconds(30)), 1) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("rank 1 has left the job")) << ranks[r]->Output();
  }
  EXPECT_LT(absl::Now() - left, Scaled(absl::Seconds(20)));
}

// A daemon killed for good: the trainers' calls retry for ZEROD_RETRY_FOR from the start of the
// outage, not each call for a minute of its own (heartbeat, heartbeat, leave: 3 minutes), then
// stop with the endpoint named. A restart within the budget is ridden through (zerod_test).
TEST(Train, ATrainerWhoseDaemonIsGoneForGoodStopsWithinItsRetryBudget) {
  ZerodHarness zerod(ShortLease());
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<std::unique_ptr<ChildProcess>> ranks =
      StartEndlessRanks(zerod, "orphan", 2, "2", 3, {}, {"ZEROD_RETRY_FOR=3s"});
  zerod.Crash();
  for (auto& rank : ranks) {
    EXPECT_EQ(rank->Wait(absl::Seconds(40)), 1) << rank->Output();
    EXPECT_THAT(rank->Output(), HasSubstr("zerod at " + zerod.endpoint() + " unavailable for 3s"))
        << rank->Output();
  }
}

TEST(Train, ATrainerWhoseSessionDoesNotStartNamesItsJobAndTheRankItAskedFor) {
  const ProcessResult r =
      RunProcess({"/usr/bin/env", "ZEROD_RETRY_FOR=1s", "ZEROD_RANK=1", TRAIN_MLP_PATH,
                  "--endpoint", "unix:///nowhere", "--job", "unstarted", "--world", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err,
              HasSubstr("train_mlp: job unstarted (world 2), rank 1: the session did not start: "));
  EXPECT_THAT(r.err, Not(HasSubstr("rank -1")));
}

// A daemon that does not run for two lease periods (SIGSTOP here; a paused VM or a starved
// machine alike) heard no heartbeat in that time: when it runs again no rank is declared lost.
// The lease is scaled and so is the pause; a rank whose heartbeat (every 500 ms) was due as the
// daemon stopped has what is left of its lease after the resume to be heard: a plain 1 s lease
// left a TSan run on a loaded machine too little.
TEST(Train, ADaemonStoppedLongerThanTheLeaseLosesNoRank) {
  const absl::Duration lease = Scaled(absl::Seconds(2));
  ZerodHarness zerod({"--lease-ttl", absl::FormatDuration(lease), "--restart-grace",
                      ScaledFlag(absl::Seconds(1))});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<std::unique_ptr<ChildProcess>> ranks = StartEndlessRanks(zerod, "paused", 2, "2", 3);
  zerod.Signal(SIGSTOP);
  absl::SleepFor(2 * lease);  // real time: the daemon must miss every heartbeat of a lease
  zerod.Signal(SIGCONT);
  const size_t seen = ranks[0]->Output().size();
  Eventually([&] { return ranks[0]->Output().size() >= seen + 200; }, absl::Seconds(10));
  absl::SleepFor(lease);  // several sweeps (every quarter lease) after the pause
  const ProcessResult members = zerod.Zeroctl({"members", "paused"});
  EXPECT_EQ(members.exit_code, 0) << members.err;
  EXPECT_THAT(members.out, Not(HasSubstr("lost"))) << members.out;
  EXPECT_THAT(zerod.Log(), HasSubstr("late (was the daemon stopped or starved?)"));
  for (auto& rank : ranks) {
    EXPECT_THAT(rank->Output(), Not(HasSubstr("lost"))) << rank->Output();
  }
}

TEST(Zerorun, PrefixesOutputSetsTheEnvironmentAndPropagatesFailure) {
  const ProcessResult ok = RunProcess(
      {ZERORUN_PATH, "-n", "2", "--endpoint", "unix:///nowhere", "--job", "env", "--", "sh", "-c",
       "echo $ZEROD_RANK/$ZEROD_WORLD_SIZE $ZEROD_JOB $ZEROD_ENDPOINT; echo oops >&2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("[rank 0] 0/2 env unix:///nowhere"));
  EXPECT_THAT(ok.out, HasSubstr("[rank 1] 1/2 env unix:///nowhere"));
  EXPECT_THAT(ok.err, HasSubstr("[rank 1] oops"));
  // Rank 1 fails with 3 while rank 0 would run for a minute: zerorun stops it and exits 3 (well
  // before the minute: the bound, scaled, is what catches a zerorun that waits for rank 0).
  const absl::Time start = absl::Now();
  const ProcessResult failed =
      RunProcess({ZERORUN_PATH, "-n", "2", "--endpoint", "unix:///nowhere", "--", "sh", "-c",
                  absl::StrCat("if [ $ZEROD_RANK = 1 ]; then exit 3; fi; sleep ",
                               absl::ToInt64Seconds(Scaled(absl::Seconds(60))))});
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_THAT(failed.err, HasSubstr("rank 1 exited with code 3"));
  // No restart follows, and the message does not promise one.
  EXPECT_THAT(failed.err, HasSubstr("zerorun: ending job "));
  EXPECT_THAT(failed.err, HasSubstr(" after its ranks failed: "));
  EXPECT_THAT(failed.err, Not(HasSubstr("before the restart")));
  EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(20)));
  // Usage errors.
  EXPECT_EQ(RunProcess({ZERORUN_PATH, "-n", "0", "--endpoint", "x", "--", "true"}).exit_code, 2);
  EXPECT_EQ(RunProcess({ZERORUN_PATH, "-n", "2", "--endpoint", "x"}).exit_code, 2);
  // Too many local ranks is refused before anything is forked, not run until files run out.
  const ProcessResult many =
      RunProcess({ZERORUN_PATH, "-n", "100000", "--endpoint", "x", "--", "true"});
  EXPECT_EQ(many.exit_code, 2);
  EXPECT_THAT(many.err, HasSubstr("-n 100000 is more local ranks than 4096"));
  const ProcessResult files = RunProcess(
      {"/bin/sh", "-c",
       std::string("ulimit -n 64 && exec ") + ZERORUN_PATH + " -n 20 --endpoint x -- true"});
  EXPECT_EQ(files.exit_code, 2);
  EXPECT_THAT(files.err, HasSubstr("-n 20 needs 96 open files, the limit is 64 (ulimit -n)"));
}

}  // namespace
}  // namespace zerod::testing
