// The status page's JSON views over a real registry and real checkpoint records.

#include "server/status/status_views.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/status/running_job.h"

namespace zerod::status {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(StatusViews, JobsListsEveryJobWithItsStepRate) {
  RunningJob env;
  ASSERT_NO_FATAL_FAILURE(env.Form("b-job", 2));
  ASSERT_NO_FATAL_FAILURE(env.Form("a-job", 1));
  JobHistory history;
  env.Heartbeat("b-job", 0, 3, 0);
  env.Heartbeat("b-job", 1, 3, 0);
  history.Sample(env.registry(), absl::FromUnixSeconds(10));
  env.Heartbeat("b-job", 0, 7, 0);
  env.Heartbeat("b-job", 1, 7, 0);
  history.Sample(env.registry(), absl::FromUnixSeconds(12));

  const json view = JobsView(env.registry(), history, absl::FromUnixSeconds(20));
  EXPECT_EQ(view["now_unix_ms"], 20000);
  ASSERT_EQ(view["jobs"].size(), 2u);
  // Formed and sampled twice without a step: a stalled job, at 0 steps per second.
  EXPECT_EQ(view["jobs"][0]["job_id"], "a-job");
  EXPECT_EQ(view["jobs"][0]["step"], 0);
  EXPECT_EQ(view["jobs"][0]["steps_per_second"], 0.0);
  const json& b = view["jobs"][1];
  EXPECT_EQ(b["job_id"], "b-job");
  EXPECT_EQ(b["state"], "running");
  EXPECT_EQ(b["world_size"], 2);
  EXPECT_EQ(b["active_members"], 2);
  EXPECT_EQ(b["stage"], 2);
  EXPECT_EQ(b["step"], 7);
  EXPECT_DOUBLE_EQ(b["steps_per_second"].get<double>(), 2.0);
}

TEST(StatusViews, AJobShowsItsMembersMemoryShardMapAndHistory) {
  RunningJob env;
  ASSERT_NO_FATAL_FAILURE(env.Form("llama", 2));
  env.Heartbeat("llama", 0, 11, 4096, /*params_bytes=*/12345);
  JobHistory history;
  const absl::StatusOr<json> view =
      JobView(env.registry(), &env.checkpoints(), history, "llama", env.clock().Now());
  ASSERT_TRUE(view.ok()) << view.status();
  const json& v = *view;
  EXPECT_EQ(v["job"]["job_id"], "llama");
  EXPECT_EQ(v["job"]["lease_ttl_ms"], 10000);
  EXPECT_FALSE(v["job"]["plan_digest"].get<std::string>().empty());
  EXPECT_EQ(v["members_total"], 2);
  ASSERT_EQ(v["members"].size(), 2u);
  const json& rank0 = v["members"][0];
  EXPECT_EQ(rank0["rank"], 0);
  EXPECT_EQ(rank0["state"], "active");
  EXPECT_EQ(rank0["host"], "host0");
  EXPECT_EQ(rank0["device"], "cpu");
  EXPECT_EQ(rank0["step"], 11);
  EXPECT_EQ(rank0["last_heartbeat_unix_ms"], absl::ToUnixMillis(env.clock().Now()));
  EXPECT_EQ(rank0["comm_bytes"]["reduce_scatter"], 4096);
  EXPECT_EQ(rank0["memory"]["reported"]["params"], 12345);
  EXPECT_EQ(rank0["memory"]["reported_total_bytes"], 12345);
  EXPECT_GT(rank0["memory"]["plan"]["params"].get<int64_t>(), 0);
  EXPECT_GT(rank0["memory"]["plan_total_bytes"].get<int64_t>(),
            rank0["memory"]["plan"]["params"].get<int64_t>());
  const json& rank1 = v["members"][1];
  EXPECT_TRUE(rank1["last_heartbeat_unix_ms"].is_null()) << "no heartbeat yet";
  EXPECT_TRUE(rank1["memory"]["reported_total_bytes"].is_null());

  const json& map = v["shard_map"];
  EXPECT_EQ(map["stage"], 2);
  EXPECT_EQ(map["world_size"], 2);
  EXPECT_EQ(map["partition_ways"], 2);
  EXPECT_EQ(map["total_numel"], 1 << 16);
  EXPECT_GE(map["padded_numel"].get<int64_t>(), 1 << 16);
  EXPECT_EQ(map["segments"].size(), map["segments_total"].get<size_t>());
  ASSERT_EQ(map["ranks"].size(), 2u);
  int64_t real = 0;
  for (const json& r : map["ranks"]) real += r["real_numel"].get<int64_t>();
  EXPECT_EQ(real, 1 << 16) << "every element is on exactly one rank";
  int64_t segment_numel = 0;
  for (const json& s : map["segments"]) segment_numel += s["numel"].get<int64_t>();
  EXPECT_EQ(segment_numel, 1 << 16);

  EXPECT_TRUE(v["history"].empty());
  EXPECT_EQ(v["history_max_points"], JobHistory::kDefaultMaxSamples);
  EXPECT_TRUE(v["checkpoints"].empty());
  EXPECT_TRUE(v["checkpoints_error"].is_null());
}

TEST(StatusViews, AJobShowsItsCheckpointsInStepOrder) {
  RunningJob env;
  ASSERT_NO_FATAL_FAILURE(env.Form("llama", 2));
  ASSERT_NO_FATAL_FAILURE(env.RecordCheckpoint("llama", 20, v1::CHECKPOINT_SAVING, "/ckpt/20"));
  ASSERT_NO_FATAL_FAILURE(env.RecordCheckpoint("llama", 10, v1::CHECKPOINT_SAVING, "/ckpt/10"));
  ASSERT_NO_FATAL_FAILURE(env.RecordCheckpoint("llama", 10, v1::CHECKPOINT_COMPLETE, "/ckpt/10"));
  JobHistory history;
  const absl::StatusOr<json> view =
      JobView(env.registry(), &env.checkpoints(), history, "llama", env.clock().Now());
  ASSERT_TRUE(view.ok()) << view.status();
  const json& checkpoints = (*view)["checkpoints"];
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0]["step"], 10);
  EXPECT_EQ(checkpoints[0]["state"], "complete");
  EXPECT_EQ(checkpoints[0]["directory"], "/ckpt/10");
  EXPECT_FALSE(checkpoints[0]["completed_unix_ms"].is_null());
  EXPECT_EQ(checkpoints[1]["step"], 20);
  EXPECT_EQ(checkpoints[1]["state"], "saving");
  EXPECT_TRUE(checkpoints[1]["completed_unix_ms"].is_null());
}

TEST(StatusViews, AnUnknownJobIsNotFoundNamingIt) {
  RunningJob env;
  JobHistory history;
  const absl::StatusOr<json> view =
      JobView(env.registry(), &env.checkpoints(), history, "nope", env.clock().Now());
  EXPECT_EQ(view.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(view.status().message()), HasSubstr("nope"));
}

// Hosts are whatever a rank sent: markup in them is data, which the view passes on as it is (the
// page shows it as text).
TEST(StatusViews, AHostWithMarkupIsPassedOnAsData) {
  RunningJob env;
  const std::string host = "<img src=x onerror=alert(1)>";
  ASSERT_NO_FATAL_FAILURE(env.Form("odd", 1, 2, host));
  JobHistory history;
  const absl::StatusOr<json> view =
      JobView(env.registry(), nullptr, history, "odd", env.clock().Now());
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(json::parse(JsonText(*view))["members"][0]["host"], host);
}

// Bytes that are not UTF-8 (nlohmann's dump throws on them by default) must not fail the answer.
TEST(StatusViews, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  const json view = {{"host", std::string("node\xff\xfe")}};
  EXPECT_EQ(JsonText(view), "{\"host\":\"node\xEF\xBF\xBD\xEF\xBF\xBD\"}");
}

TEST(StatusViews, StateNamesAreTheWordsZeroctlUses) {
  EXPECT_STREQ(JobStateName(v1::JOB_FORMING), "forming");
  EXPECT_STREQ(JobStateName(v1::JOB_DEGRADED), "degraded");
  EXPECT_STREQ(JobStateName(v1::JOB_ENDED), "ended");
  EXPECT_STREQ(CheckpointStateName(v1::CHECKPOINT_REMOVED), "removed");
}

}  // namespace
}  // namespace zerod::status
