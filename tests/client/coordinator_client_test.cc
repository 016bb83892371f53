// CoordinatorClient against the real zerod binary: every call's round trip, the retry rule
// (UNAVAILABLE is retried until retry_for, nothing else is), deadlines, and the heartbeat thread.

#include "client/coordinator_client.h"

#include <cstdlib>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using ::testing::HasSubstr;

client::JoinOptions JoinOf(const std::string& job, int64_t world, int64_t rank) {
  client::JoinOptions o;
  o.job_id = job;
  o.world_size = world;
  o.rank = rank;
  o.host = "test-host";
  o.layout = plan::SyntheticLayout(1 << 16, DType::kBFloat16, 4);
  o.plan_options.stage = 2;
  return o;
}

TEST(ResolveEndpoint, TheFlagWinsThenTheEnvironmentElseAnErrorThatSaysWhatToSet) {
  ::unsetenv("ZEROD_ENDPOINT");
  absl::StatusOr<std::string> none = client::ResolveEndpoint("");
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("ZEROD_ENDPOINT"));
  ::setenv("ZEROD_ENDPOINT", "unix:///from/env.sock", 1);
  EXPECT_EQ(*client::ResolveEndpoint(""), "unix:///from/env.sock");
  EXPECT_EQ(*client::ResolveEndpoint("localhost:1"), "localhost:1");
  ::unsetenv("ZEROD_ENDPOINT");
}

TEST(CoordinatorClient, JoinReturnsTheSamePlanToEveryRankAndGetPlanAgrees) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  absl::StatusOr<client::Membership> second;
  std::thread other(
      [&] { second = zerod.Client()->Join(JoinOf("j", 2, 1), Scaled(absl::Seconds(20))); });
  auto client = zerod.Client();
  absl::StatusOr<client::Membership> first =
      client->Join(JoinOf("j", 2, 0), Scaled(absl::Seconds(20)));
  other.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->rank, 0);
  EXPECT_EQ(second->rank, 1);
  EXPECT_EQ(first->world_size, 2);
  EXPECT_EQ(first->generation, second->generation);
  EXPECT_EQ(first->plan->DigestHex(), second->plan->DigestHex());
  EXPECT_EQ(first->plan->stage(), 2);
  absl::StatusOr<v1::PlanInputs> inputs = client->GetPlan("j");
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  EXPECT_EQ(inputs->SerializeAsString(), first->plan_inputs.SerializeAsString());

  absl::StatusOr<v1::JobDescription> job = client->DescribeJob("j");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->members_size(), 2);
  EXPECT_EQ(job->plan_digest(), first->plan->DigestHex());
  absl::StatusOr<v1::ListJobsResponse> jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->jobs_size(), 1);
  absl::StatusOr<v1::ShardMapResponse> shards = client->ShardMap("j", 1, "");
  ASSERT_TRUE(shards.ok()) << shards.status();

  absl::StatusOr<int64_t> left = client->Leave("j", 0);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(client->EndJob("j").ok());
}

TEST(CoordinatorClient, StoreCallsRoundTripWithTheirSemantics) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  ASSERT_TRUE(client->Join(JoinOf("s", 1, 0), Scaled(absl::Seconds(20))).ok());
  ASSERT_TRUE(client->StoreSet("s", "k", "v1").ok());
  EXPECT_EQ(*client->StoreGet("s", "k", absl::Seconds(1)), "v1");
  EXPECT_EQ(*client->StoreAdd("s", "n", 5), 5);
  EXPECT_EQ(*client->StoreAdd("s", "n", -2), 3);
  absl::StatusOr<v1::CompareSetResponse> lost = client->StoreCompareSet("s", "k", "other", "v2");
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_FALSE(lost->swapped());
  EXPECT_EQ(lost->value(), "v1");
  absl::StatusOr<v1::CompareSetResponse> won = client->StoreCompareSet("s", "k", "v1", "v2");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(won->swapped());
  EXPECT_TRUE(client->StoreCompareSet("s", "fresh", std::nullopt, "x")->swapped());
  EXPECT_TRUE(client->StoreWait("s", {"k", "fresh"}, absl::Seconds(1)).ok());
  EXPECT_TRUE(*client->StoreDelete("s", "k"));
  EXPECT_FALSE(*client->StoreDelete("s", "k"));
  EXPECT_TRUE(client->Barrier("s", "b", 0, 1, absl::Seconds(1)).ok());
}

TEST(CoordinatorClient, ABlockingGetIsAnsweredWhenAnotherClientSetsTheKey) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  ASSERT_TRUE(client->Join(JoinOf("g", 1, 0), Scaled(absl::Seconds(20))).ok());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(zerod.Client()->StoreSet("g", "late", "here").ok());
  });
  absl::StatusOr<std::string> got = client->StoreGet("g", "late", Scaled(absl::Seconds(20)));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
}

TEST(CoordinatorClient, AGetOfAMissingKeyEndsAtItsTimeoutAndIsNotRetried) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  ASSERT_TRUE(client->Join(JoinOf("t", 1, 0), Scaled(absl::Seconds(20))).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = client->StoreGet("t", "never", absl::Milliseconds(300));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  // Well under the client's retry window (10 s, scaled): a deadline is an answer, not a reason to
  // retry.
  EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(5)));
}

TEST(CoordinatorClient, ErrorsOtherThanUnavailableComeBackAtOnceWithTheDaemonsWords) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client(Scaled(absl::Seconds(30)));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::PlanInputs> plan = client->GetPlan("no-such-job");
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(plan.status().message(), HasSubstr("no-such-job"));
  EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(10)));
}

TEST(CoordinatorClient, UnavailableIsRetriedUntilRetryForThenNamesTheCallAndEndpoint) {
  ZerodHarness zerod;  // never started: nothing listens on its socket
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ListJobsResponse> jobs = zerod.Client(absl::Milliseconds(400))->ListJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(jobs.status().message(), HasSubstr("list jobs: zerod at " + zerod.endpoint()));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));
}

// The budget is the outage's, not each call's: a trainer whose daemon was gone for good spent a
// minute in each of heartbeat, heartbeat and leave, one after the other.
TEST(CoordinatorClient, CallsShareOneRetryBudgetPerOutage) {
  ZerodHarness zerod;  // never started
  // Scaled, so that half of it (below) is ample for a failed call of a slow build.
  const absl::Duration budget = Scaled(absl::Seconds(2));
  auto client = zerod.Client(budget);
  const absl::Time start = absl::Now();
  EXPECT_EQ(client->ListJobs().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_GE(absl::Now() - start, budget);
  const absl::Time second = absl::Now();
  const absl::Status s = client->DescribeJob("j").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("describe job: zerod at " + zerod.endpoint()));
  EXPECT_LT(absl::Now() - second, budget / 2) << "the outage's budget was spent already";
}

TEST(CoordinatorClient, ACallRidesThroughADaemonThatComesUpLate) {
  ZerodHarness zerod;
  auto client = zerod.Client(Scaled(absl::Seconds(20)));
  absl::StatusOr<v1::ListJobsResponse> jobs;
  std::thread caller([&] { jobs = client->ListJobs(); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  caller.join();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
}

TEST(CoordinatorClient, HeartbeatsCarryTheReportAndStopWhenAsked) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  absl::StatusOr<client::Membership> m = client->Join(JoinOf("h", 1, 0), Scaled(absl::Seconds(20)));
  ASSERT_TRUE(m.ok()) << m.status();
  Mutex mu;
  int replies = 0;  // guarded by mu
  client->StartHeartbeats(
      "h", 0, m->generation, absl::Milliseconds(20),
      [] {
        client::HeartbeatReport r;
        r.step = 42;
        r.memory_bytes["fp32_master"] = 1234;
        r.comm_bytes["all_gather"] = 99;
        return r;
      },
      [&](const absl::StatusOr<v1::HeartbeatResponse>& reply) {
        EXPECT_TRUE(reply.ok()) << reply.status();
        MutexLock lock(&mu);
        ++replies;
      });
  {
    MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return replies >= 3; }, Scaled(absl::Seconds(20))));
  }
  client->StopHeartbeats();
  int after_stop = 0;
  {
    MutexLock lock(&mu);
    after_stop = replies;
  }
  absl::StatusOr<v1::JobDescription> job = client->DescribeJob("h");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->members_size(), 1);
  EXPECT_EQ(job->members(0).step(), 42);
  EXPECT_EQ(job->members(0).memory_bytes().at("fp32_master"), 1234);
  EXPECT_EQ(job->members(0).comm_bytes().at("all_gather"), 99);
  // Heartbeats can start again after a stop (the thread was joined, not abandoned).
  client->StartHeartbeats("h", 0, m->generation, absl::Milliseconds(20), nullptr,
                          [&](const absl::StatusOr<v1::HeartbeatResponse>&) {
                            MutexLock lock(&mu);
                            ++replies;
                          });
  {
    MutexLock lock(&mu);
    ASSERT_TRUE(
        mu.AwaitWithTimeout([&] { return replies > after_stop; }, Scaled(absl::Seconds(20))));
  }
  client->StopHeartbeats();
}

}  // namespace
}  // namespace zerod::testing
