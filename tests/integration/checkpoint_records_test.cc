// The coordinator's checkpoint records against the real zerod: a job formed by real ranks, rank 0
// recording a save and its completion, `zeroctl checkpoints` listing it, the record surviving the
// job's end and a kill -9 of the daemon, and callers without the job's token refused.

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = "ckpt-records";

v1::CheckpointRecord Checkpoint(int64_t step, v1::CheckpointState state,
                                const std::string& directory, int64_t stage) {
  v1::CheckpointRecord r;
  r.set_job_id(kJob);
  r.set_step(step);
  r.set_directory(directory);
  r.set_world_size(2);
  r.set_stage(static_cast<int32_t>(stage));
  r.set_state(state);
  return r;
}

// Sets an environment variable for one scope (this process's SDK reads its config dir from it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) before_ = before;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { before_ ? setenv(name_, before_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> before_;
};

TEST(ZerodCheckpoints, ASaveRecordedByRankZeroIsListedOutlivesTheJobAndARestartAndNeedsTheToken) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  // Rank 1 is a process of its own that sets a Store key and exits; this test is rank 0, and
  // tells the coordinator of its saves as the runtime's rank 0 does.
  auto rank1 = zerod.StartRank({"--job", kJob, "--world", "2", "--rank", "1", "--set", "addr=x"});
  auto rank0 = zerod.Client();
  client::JoinOptions join;
  join.job_id = kJob;
  join.world_size = 2;
  join.rank = 0;
  join.layout = plan::SyntheticLayout(1 << 20, DType::kBFloat16, 8);
  join.plan_options.stage = 2;
  auto membership = rank0->Join(join, Scaled(absl::Seconds(60)));
  ASSERT_TRUE(membership.ok()) << membership.status();
  EXPECT_EQ(zerod.Finish(*rank1)["rank"], 1);
  const int64_t stage = membership->plan->stage();
  const std::string directory = zerod.dir().path() + "/checkpoints/step-100";

  const ProcessResult none = zerod.Zeroctl({"checkpoints", kJob});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out, absl::StrCat("no checkpoints for job ", kJob, "\n"));

  auto saving = rank0->RecordCheckpoint(Checkpoint(100, v1::CHECKPOINT_SAVING, directory, stage));
  ASSERT_TRUE(saving.ok()) << saving.status();
  EXPECT_GT(saving->created_unix_ms(), 0);
  const ProcessResult while_saving = zerod.Zeroctl({"checkpoints", kJob});
  EXPECT_EQ(while_saving.exit_code, 0) << while_saving.err;
  EXPECT_THAT(while_saving.out, HasSubstr("saving"));
  v1::CheckpointRecord complete = Checkpoint(100, v1::CHECKPOINT_COMPLETE, directory, stage);
  complete.set_bytes(3'000'000);
  auto completed = rank0->RecordCheckpoint(complete);
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_GE(completed->completed_unix_ms(), saving->created_unix_ms());

  // Without the job's token nothing is recorded: another token, or none at all.
  client::ClientOptions stranger;
  stranger.endpoint = zerod.endpoint();
  stranger.job_token = client::NewToken();
  auto other = client::CoordinatorClient::Connect(stranger);
  ASSERT_TRUE(other.ok());
  auto denied =
      (*other)->RecordCheckpoint(Checkpoint(100, v1::CHECKPOINT_REMOVED, directory, stage));
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(std::string(denied.status().message()), HasSubstr("job ckpt-records"));
  EXPECT_THAT(std::string(denied.status().message()), Not(HasSubstr(stranger.job_token)));
  {
    TempDir empty_config;
    ScopedEnv config("XDG_CONFIG_HOME", empty_config.path().c_str());
    ScopedEnv token("ZEROD_JOB_TOKEN", nullptr);
    client::ClientOptions anonymous;
    anonymous.endpoint = zerod.endpoint();
    auto nobody = client::CoordinatorClient::Connect(anonymous);
    ASSERT_TRUE(nobody.ok());
    auto refused =
        (*nobody)->RecordCheckpoint(Checkpoint(200, v1::CHECKPOINT_SAVING, directory, stage));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  }

  // The job's end deletes its Store keys, not its checkpoint records.
  ASSERT_TRUE(rank0->EndJob(kJob).ok());
  EXPECT_FALSE(rank0->StoreGet(kJob, "addr", absl::ZeroDuration()).ok());
  auto after_end = rank0->ListCheckpoints(kJob);
  ASSERT_TRUE(after_end.ok()) << after_end.status();
  ASSERT_EQ(after_end->size(), 1u);
  EXPECT_EQ((*after_end)[0].state(), v1::CHECKPOINT_COMPLETE);

  // A crash and a restart keep it, as it was.
  zerod.Crash();
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const ProcessResult listed = zerod.Zeroctl({"checkpoints", kJob, "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  const json doc = json::parse(listed.out);
  EXPECT_EQ(doc["job_id"], kJob);
  ASSERT_EQ(doc["checkpoints"].size(), 1u) << listed.out;
  const json& c = doc["checkpoints"][0];
  EXPECT_EQ(c["step"], 100);
  EXPECT_EQ(c["state"], "complete");
  EXPECT_EQ(c["world_size"], 2);
  EXPECT_EQ(c["stage"], stage);
  EXPECT_EQ(c["bytes"], 3'000'000);
  EXPECT_EQ(c["directory"], directory);
  EXPECT_EQ(c["created_unix_ms"], saving->created_unix_ms());
  EXPECT_EQ(c["completed_unix_ms"], completed->completed_unix_ms());
  const ProcessResult table = zerod.Zeroctl({"checkpoints", kJob});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("STEP"));
  EXPECT_THAT(table.out, HasSubstr("complete"));
  EXPECT_THAT(table.out, HasSubstr("3.00 MB"));
  EXPECT_THAT(table.out, HasSubstr(directory + "\n"));

  // The rules go on after the restart: the owner removes it.
  auto removed = rank0->RecordCheckpoint(Checkpoint(100, v1::CHECKPOINT_REMOVED, directory, stage));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->state(), v1::CHECKPOINT_REMOVED);
  EXPECT_EQ(removed->completed_unix_ms(), completed->completed_unix_ms());
}

TEST(ZerodCheckpoints, ZeroctlCheckpointsOfAnUnknownJobIsOneLineAndExitTwo) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const ProcessResult r = zerod.Zeroctl({"checkpoints", "no-such-job"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "zeroctl: job no-such-job not found\n");
  auto c = zerod.Client();
  auto recorded = c->RecordCheckpoint(
      Checkpoint(1, v1::CHECKPOINT_SAVING, zerod.dir().path() + "/ckpt", /*stage=*/1));
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kNotFound) << recorded.status();
  EXPECT_THAT(std::string(recorded.status().message()), HasSubstr("job ckpt-records not found"));
}

}  // namespace
}  // namespace zerod::testing
