// JobMetrics over a real JobRegistry (SQLite store, fake clock): the series a scrape writes for
// open jobs, the per-rank bound, and what goes when a job ends.

#include "server/metrics/job_metrics.h"

#include <future>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"
#include "server/metrics/server_metrics.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class JobMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = *server::SqliteKvStore::Open(dir_.path() + "/state.db", server::Durability::kNormal);
    registry_ = std::make_unique<server::JobRegistry>(
        kv_.get(), &clock_, server::RegistryOptions{absl::Seconds(10), absl::Seconds(5)});
    ASSERT_TRUE(registry_->Recover().ok());
  }

  // Forms job `job` of `world` ranks.
  void Form(const std::string& job, int64_t world) {
    google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
    rpc::ToProto(plan::SyntheticLayout(1 << 16, DType::kBFloat16, 4), &wire);
    std::vector<std::future<absl::StatusOr<server::JoinResult>>> joined;
    for (int64_t r = 0; r < world; ++r) {
      server::JoinArgs a;
      a.job_id = job;
      a.world_size = world;
      a.rank = r;
      a.host = "host" + std::to_string(r);
      a.device = "cpu";
      a.budget_bytes = 1 << 30;
      a.layout.assign(wire.begin(), wire.end());
      a.layout_digest = plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
      a.options.set_stage(2);
      auto promise = std::make_shared<std::promise<absl::StatusOr<server::JoinResult>>>();
      joined.push_back(promise->get_future());
      registry_->Join(std::move(a), clock_.Now() + absl::Seconds(30),
                      [promise](auto r) { promise->set_value(std::move(r)); });
    }
    for (auto& f : joined) ASSERT_TRUE(f.get().ok());
  }

  void Heartbeat(const std::string& job, int64_t rank, int64_t step) {
    v1::HeartbeatRequest hb;
    hb.set_job_id(job);
    hb.set_rank(rank);
    hb.set_generation(1);
    hb.set_step(step);
    (*hb.mutable_memory_bytes())["params"] = 1000 + rank;
    (*hb.mutable_comm_bytes())["all_gather"] = 100 * step;
    ASSERT_TRUE(registry_->Heartbeat(hb).ok());
  }

  std::string Scrape(JobMetrics& metrics) {
    TextWriter out;
    metrics.Write(out, clock_.Now());
    return out.Take();
  }

  testing::TempDir dir_;
  server::FakeClock clock_;
  std::unique_ptr<server::SqliteKvStore> kv_;
  std::unique_ptr<server::JobRegistry> registry_;
};

TEST_F(JobMetricsTest, AnOpenJobHasItsStateStepsMemoryAndBytesSent) {
  ASSERT_NO_FATAL_FAILURE(Form("small", 2));
  JobMetrics metrics(registry_.get(), JobMetricsOptions{});
  Heartbeat("small", 0, 5);
  Heartbeat("small", 1, 4);
  std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("zerod_jobs{state=\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("zerod_jobs{state=\"ended\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_ranks{job_id=\"small\",state=\"active\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_ranks{job_id=\"small\",state=\"lost\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_world_size{job_id=\"small\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_generation{job_id=\"small\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_step_max{job_id=\"small\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_step_min{job_id=\"small\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("zerod_rank_step{job_id=\"small\",rank=\"1\"} 4\n"));
  EXPECT_THAT(text,
              HasSubstr("zerod_rank_memory_bytes{job_id=\"small\",rank=\"1\",category=\"params\"} "
                        "1001\n"));
  EXPECT_THAT(
      text, HasSubstr("zerod_rank_memory_budget_bytes{job_id=\"small\",rank=\"0\"} 1073741824\n"));
  EXPECT_THAT(text,
              HasSubstr("zerod_job_memory_bytes_max{job_id=\"small\",category=\"params\"} 1001\n"));
  EXPECT_THAT(
      text, HasSubstr("zerod_job_comm_sent_bytes_total{job_id=\"small\",collective=\"all_gather\"} "
                      "900\n"));
  EXPECT_THAT(text, HasSubstr("zerod_rank_comm_sent_bytes_total{job_id=\"small\",rank=\"0\","
                              "collective=\"all_gather\"} 500\n"));
  EXPECT_THAT(text,
              HasSubstr("zerod_job_plan_memory_bytes{job_id=\"small\",category=\"params\"} "));
  EXPECT_THAT(text, HasSubstr("zerod_job_plan_allocated_bytes_per_rank{job_id=\"small\"} "));
  EXPECT_THAT(
      text, HasSubstr("zerod_rank_last_heartbeat_timestamp_seconds{job_id=\"small\",rank=\"0\"} "));
  EXPECT_THAT(text, Not(HasSubstr("zerod_job_step_rate{"))) << "one sample is no rate";

  clock_.Advance(absl::Seconds(2));
  Heartbeat("small", 0, 25);
  EXPECT_THAT(Scrape(metrics), HasSubstr("zerod_job_step_rate{job_id=\"small\"} 10\n"));
}

TEST_F(JobMetricsTest, AJobAboveTheRankBoundGetsJobLevelSeriesOnly) {
  ASSERT_NO_FATAL_FAILURE(Form("big", 3));
  JobMetrics metrics(registry_.get(), JobMetricsOptions{.max_ranks_per_job = 2});
  for (int64_t r = 0; r < 3; ++r) Heartbeat("big", r, 7 + r);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, Not(HasSubstr("zerod_rank_step{job_id=\"big\"")));
  EXPECT_THAT(text, Not(HasSubstr("zerod_rank_memory_bytes{job_id=\"big\"")));
  EXPECT_THAT(text, Not(HasSubstr("zerod_rank_comm_sent_bytes_total{job_id=\"big\"")));
  EXPECT_THAT(text, HasSubstr("zerod_job_step_min{job_id=\"big\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("zerod_job_step_max{job_id=\"big\"} 9\n"));
  EXPECT_THAT(text,
              HasSubstr("zerod_job_memory_bytes_max{job_id=\"big\",category=\"params\"} 1002\n"));
}

TEST_F(JobMetricsTest, AnEndedJobLosesItsSeriesAndItsCountersButIsCountedAsEnded) {
  ASSERT_NO_FATAL_FAILURE(Form("done", 1));
  JobMetrics metrics(registry_.get(), JobMetricsOptions{});
  Heartbeat("done", 0, 3);
  Metrics().heartbeats.WithLabels({"done"})->Increment();
  Metrics().joins.WithLabels({"done"})->Increment();
  EXPECT_THAT(Scrape(metrics), HasSubstr("zerod_rank_step{job_id=\"done\",rank=\"0\"} 3\n"));
  std::promise<absl::Status> ended;
  registry_->EndJob("done", [&](absl::Status s) { ended.set_value(s); });
  ASSERT_TRUE(ended.get_future().get().ok());
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("zerod_jobs{state=\"ended\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"done\"")));
  EXPECT_THAT(DefaultRegistry().Scrape(), Not(HasSubstr("job_id=\"done\"")));
}

}  // namespace
}  // namespace zerod::metrics
