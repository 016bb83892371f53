// Elastic recovery: zerorun --max-restarts starts the world again after a rank dies, and the
// trainers (train_mlp) restore the newest complete checkpoint, resharded to the new world, from
// the in-memory snapshot or from disk. Each run is compared with the same run uninterrupted, and
// with the unsharded reference on the same global batches.

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

struct Run {
  std::string job;
  int ranks = 4;
  std::vector<std::string> zerorun_flags;  // --max-restarts ...
  std::vector<std::string> trainer_flags;  // beyond the common ones
};

ProcessResult Launch(ZerodHarness& zerod, const Run& run, const std::string& stage) {
  std::vector<std::string> argv = {Built(ZERORUN_PATH),
                                   "-n",
                                   std::to_string(run.ranks),
                                   "--endpoint",
                                   zerod.endpoint(),
                                   "--job",
                                   run.job};
  argv.insert(argv.end(), run.zerorun_flags.begin(), run.zerorun_flags.end());
  for (const std::string& a :
       {std::string("--"), Built(TRAIN_MLP_PATH), std::string("--stage"), stage,
        std::string("--dtype"), std::string("fp32"), std::string("--seed"), std::string("5")}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), run.trainer_flags.begin(), run.trainer_flags.end());
  return RunProcess(argv);
}

double FinalLoss(const ProcessResult& r) { return TrainSummary(r.out)["final_loss"].get<double>(); }

// fp32 state restored bit for bit and the same world and batches: the same run, up to the
// rounding of the final average.
constexpr double kSameRun = 1e-6;
// Another world: every gradient is reduced in another order.
constexpr double kOtherWorld = 1e-5;

TEST(Elastic, AKilledRankIsReplacedFromTheInMemorySnapshotAndTheRunEndsAsIfUninterrupted) {
  if (!std::filesystem::is_directory("/dev/shm")) {
    GTEST_SKIP() << "no /dev/shm: zerorun gives its ranks no snapshot directory here";
  }
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir checkpoints;
  const std::vector<std::string> common = {
      "--steps", "12", "--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "4"};
  const ProcessResult whole = Launch(zerod, {"whole", 4, {}, common}, "2");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;

  std::vector<std::string> flags = common;
  flags[3] = checkpoints.path() + "/elastic";
  flags.insert(flags.end(), {"--kill-rank-at", "2:7"});
  const ProcessResult r = Launch(zerod, {"elastic", 4, {"--max-restarts", "1"}, flags}, "2");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 2] rank 2: failure injection: SIGKILL after step 7"));
  EXPECT_THAT(r.err, HasSubstr("zerorun: rank 2 exited with code 137"));
  EXPECT_THAT(r.err, HasSubstr("zerorun: restart 1 of 1: 4 ranks"));
  // The snapshot of step 7 (shared memory), newer than the checkpoint of step 4 on disk.
  EXPECT_THAT(r.out, HasSubstr("rank 2: resumed from step 7 (/dev/shm/"));
  EXPECT_THAT(r.out, HasSubstr("saved by 4 ranks at stage 2"));
  EXPECT_EQ(TrainSummary(r.out)["first_step"], 8);
  EXPECT_NEAR(FinalLoss(r), FinalLoss(whole), kSameRun * FinalLoss(whole));
  // The snapshots were in a directory of this zerorun's own (0700), removed when it ended.
  const std::string prefix = absl::StrCat("zerod-", getuid(), "-elastic-");
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind(prefix, 0), 0u) << entry.path();
  }
}

TEST(Elastic, WithMinRanksTheWorldShrinksKeepingTheGlobalBatchAndTheStage3RunEndsAsTheReference) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const ProcessResult reference = RunProcess({Built(TRAIN_MLP_PATH), "--reference", "--world", "4",
                                              "--dtype", "fp32", "--steps", "10", "--seed", "5"});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const ProcessResult r = Launch(zerod,
                                 {"shrink",
                                  4,
                                  {"--max-restarts", "2", "--min-ranks", "3"},
                                  {"--steps", "10", "--kill-rank-at", "1:5"}},
                                 "3");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("zerorun: restart 1 of 2: 3 ranks"));
  EXPECT_THAT(r.out, HasSubstr("rank 0: resumed from step 5"));
  EXPECT_THAT(r.out, HasSubstr("saved by 4 ranks at stage 3"));
  const json summary = TrainSummary(r.out);
  EXPECT_EQ(summary["world_size"], 3);
  EXPECT_NEAR(FinalLoss(r), FinalLoss(reference), kOtherWorld * FinalLoss(reference));
}

TEST(Elastic, WithoutSnapshotsARestartResumesFromTheLastDurableCheckpointListedByTheCoordinator) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir checkpoints;
  const std::vector<std::string> common = {
      "--steps",          "12", "--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "4",
      "--snapshot-every", "0"};
  const ProcessResult whole = Launch(zerod, {"disk-whole", 3, {}, {"--steps", "12"}}, "1");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  std::vector<std::string> flags = common;
  flags.insert(flags.end(), {"--kill-rank-at", "0:6"});
  const ProcessResult r = Launch(zerod, {"disk", 3, {"--max-restarts", "1"}, flags}, "1");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("rank 1: resumed from step 4 (", checkpoints.path(),
                                            "/step-000000000004")));
  EXPECT_NEAR(FinalLoss(r), FinalLoss(whole), kSameRun * FinalLoss(whole));
  // keep_last 2: steps 8 and 12 remain, the others were removed after a newer one was complete.
  EXPECT_TRUE(std::filesystem::exists(checkpoints.path() + "/step-000000000012/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(checkpoints.path() + "/step-000000000008/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(checkpoints.path() + "/step-000000000004"));
  const ProcessResult listed = zerod.Zeroctl({"checkpoints", "disk"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("step-000000000012"));
  EXPECT_THAT(listed.out, HasSubstr("complete"));
}

// kill -9 in the middle of a save: rank 1 dies with its file of step 8 half written (a .tmp), so
// no manifest is written and the coordinator's record stays "saving". Without restarts the job
// fails; verify and zeroctl report the step as partial / saving; a resumed run loads step 4 and,
// saving step 8 again, completes it.
TEST(Elastic, ARankKilledMidSaveLeavesAPartialCheckpointThatIsReportedAndNeverLoaded) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir checkpoints;
  const std::vector<std::string> common = {
      "--steps", "12", "--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "4"};
  const ProcessResult whole = Launch(zerod, {"midsave-whole", 2, {}, {"--steps", "12"}}, "3");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  std::vector<std::string> flags = common;
  flags.insert(flags.end(), {"--kill-rank-in-save", "1:8"});
  const ProcessResult killed = Launch(zerod, {"midsave", 2, {}, flags}, "3");
  EXPECT_EQ(killed.exit_code, 137) << killed.out << killed.err;
  EXPECT_THAT(killed.out, HasSubstr("[rank 1] failure injection: SIGKILL with"));
  const std::string step8 = checkpoints.path() + "/step-000000000008";
  // The rank's file is still under its temporary name (rank-00001.shard.XXXXXX.tmp).
  bool half_written = false;
  for (const auto& entry : std::filesystem::directory_iterator(step8)) {
    const std::string name = entry.path().filename().string();
    half_written |= name.rfind("rank-00001.shard.", 0) == 0 && entry.path().extension() == ".tmp";
  }
  EXPECT_TRUE(half_written);
  EXPECT_FALSE(std::filesystem::exists(step8 + "/manifest.json"));
  const ProcessResult verify = RunProcess({Built(ZEROCTL_PATH), "checkpoint", "verify", step8});
  EXPECT_EQ(verify.exit_code, 1) << verify.out << verify.err;
  EXPECT_THAT(verify.out + verify.err, HasSubstr("partial"));
  const ProcessResult listed = zerod.Zeroctl({"checkpoints", "midsave"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, MatchesRegex("(.|\n)*8 +saving(.|\n)*"));

  const ProcessResult resumed = Launch(zerod,
                                       {"midsave",
                                        2,
                                        {},
                                        [&] {
                                          std::vector<std::string> f = common;
                                          f.push_back("--resume");
                                          return f;
                                        }()},
                                       "3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("rank 0: resumed from step 4"));
  EXPECT_NEAR(FinalLoss(resumed), FinalLoss(whole), kSameRun * FinalLoss(whole));
  EXPECT_EQ(RunProcess({Built(ZEROCTL_PATH), "checkpoint", "verify", step8}).exit_code, 0);
}

TEST(Elastic, APartialCheckpointIsSkippedAndTheLastCompleteOneIsLoaded) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir checkpoints;
  const ProcessResult first =
      Launch(zerod,
             {"partial",
              2,
              {},
              {"--steps", "4", "--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "2"}},
             "2");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  // What a crash in the middle of saving step 6 leaves: rank files without a manifest.
  const std::string partial = checkpoints.path() + "/step-000000000006";
  std::filesystem::copy(checkpoints.path() + "/step-000000000004", partial);
  std::filesystem::remove(partial + "/manifest.json");
  const ProcessResult verify = RunProcess({Built(ZEROCTL_PATH), "checkpoint", "verify", partial});
  EXPECT_NE(verify.exit_code, 0);
  EXPECT_THAT(verify.out + verify.err, HasSubstr("partial"));
  // The job run again resuming from its root (its records list step 4 there): step 4, saying why
  // not step 6.
  const ProcessResult resumed = Launch(
      zerod,
      {"partial", 2, {}, {"--steps", "6", "--checkpoint-dir", checkpoints.path(), "--resume"}},
      "2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("resumed from step 4"));
  EXPECT_THAT(resumed.out, Not(HasSubstr("resumed from step 6")));
  EXPECT_THAT(resumed.err, HasSubstr("skipped newer: " + partial + " (rank files but no manifest"));
}

// The case: the newest checkpoint is damaged (one byte of a rank file). An elastic run
// (--max-restarts 2) resuming from the root falls back to the newest intact one at once, saying
// which it skipped and why, instead of failing on the damaged one until its restarts are spent;
// it trains on as the uninterrupted run, saving the damaged step again.
TEST(Elastic, ADamagedNewestCheckpointIsSkippedForTheNewestIntactOneInsteadOfSpendingTheRestarts) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir checkpoints;
  const ProcessResult whole = Launch(zerod, {"damaged-whole", 2, {}, {"--steps", "6"}}, "2");
  ASSERT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  const std::vector<std::string> saving = {
      "--checkpoint-dir", checkpoints.path(), "--checkpoint-every", "2", "--keep-last", "0"};
  std::vector<std::string> flags = saving;
  flags.insert(flags.end(), {"--steps", "4"});
  const ProcessResult first = Launch(zerod, {"damaged", 2, {}, flags}, "2");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string step4 = checkpoints.path() + "/step-000000000004";
  {
    std::fstream f(step4 + "/rank-00001.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  flags = saving;
  flags.insert(flags.end(), {"--steps", "6", "--resume"});
  const ProcessResult r = Launch(zerod, {"damaged", 2, {"--max-restarts", "2"}, flags}, "2");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("zerorun: restart")));
  EXPECT_THAT(r.out, HasSubstr("rank 0: resumed from step 2"));
  EXPECT_THAT(r.err, HasSubstr("skipped newer: " + step4));
  EXPECT_THAT(r.err, HasSubstr("rank-00001.shard: checksum mismatch"));
  EXPECT_THAT(r.err, HasSubstr("set aside as " + step4 + ".damaged-"));
  EXPECT_NEAR(FinalLoss(r), FinalLoss(whole), kSameRun * FinalLoss(whole));
  EXPECT_EQ(RunProcess({Built(ZEROCTL_PATH), "checkpoint", "verify", step4}).exit_code, 0);
}

// Another job's checkpoint copied into this job's root at a higher step: no record lists it there
// (this job never saved it, and the job that did recorded it in its own root), so the resume takes
// this job's own newest and says why not the other.
TEST(Elastic, AnotherJobsCheckpointCopiedInIsNotResumedFrom) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir theirs, mine;
  const ProcessResult other =
      Launch(zerod,
             {"theirs",
              2,
              {},
              {"--steps", "6", "--checkpoint-dir", theirs.path(), "--checkpoint-every", "6"}},
             "2");
  ASSERT_EQ(other.exit_code, 0) << other.out << other.err;
  const ProcessResult first = Launch(
      zerod,
      {"mine", 2, {}, {"--steps", "2", "--checkpoint-dir", mine.path(), "--checkpoint-every", "2"}},
      "2");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  std::filesystem::copy(theirs.path() + "/step-000000000006", mine.path() + "/step-000000000006",
                        std::filesystem::copy_options::recursive);
  const ProcessResult resumed = Launch(
      zerod, {"mine", 2, {}, {"--steps", "4", "--checkpoint-dir", mine.path(), "--resume"}}, "2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("rank 0: resumed from step 2"));
  EXPECT_THAT(resumed.err,
              HasSubstr(mine.path() + "/step-000000000006 (not in job mine's records: "
                                      "saved by job theirs; another job's checkpoint loads only "
                                      "when its directory is named)"));
}

}  // namespace
}  // namespace zerod::testing
