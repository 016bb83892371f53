// JobRegistry with a real SQLite store and a fake clock: formation, refusals, leases, restarts.

#include "server/job_registry.h"

#include <future>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;

std::vector<v1::TensorSpec> Layout(int64_t params = 1 << 20) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
  rpc::ToProto(plan::SyntheticLayout(params, DType::kBFloat16, 8), &wire);
  return {wire.begin(), wire.end()};
}

std::string DigestOf(const std::vector<v1::TensorSpec>& layout) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(layout.begin(), layout.end());
  return plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
}

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }

  void Reopen() {
    registry_.reset();
    kv_.reset();
    kv_ = *SqliteKvStore::Open(dir_.path() + "/state.db", Durability::kFull);
    registry_ = std::make_unique<JobRegistry>(kv_.get(), &clock_, options_);
    ASSERT_TRUE(registry_->Recover().ok());
  }

  JoinArgs Args(int64_t rank, int64_t world, std::string host = "") {
    JoinArgs a;
    a.job_id = "llama";
    a.world_size = world;
    a.rank = rank;
    a.host = host.empty() ? "host" + std::to_string(rank) : host;
    a.device = "cpu";
    a.layout = Layout();
    a.layout_digest = DigestOf(a.layout);
    a.options.set_stage(2);
    return a;
  }

  std::future<absl::StatusOr<JoinResult>> Join(JoinArgs args,
                                               absl::Duration wait = absl::Seconds(30)) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<JoinResult>>>();
    auto future = promise->get_future();
    registry_->Join(std::move(args), clock_.Now() + wait,
                    [promise](absl::StatusOr<JoinResult> r) { promise->set_value(std::move(r)); });
    return future;
  }

  // Forms a job of `world` ranks and returns their results.
  std::vector<JoinResult> Form(int64_t world) {
    std::vector<std::future<absl::StatusOr<JoinResult>>> futures;
    for (int64_t r = 0; r < world; ++r) futures.push_back(Join(Args(r, world)));
    std::vector<JoinResult> results;
    for (auto& f : futures) {
      auto r = f.get();
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) results.push_back(*r);
    }
    return results;
  }

  testing::TempDir dir_;
  FakeClock clock_;
  RegistryOptions options_{absl::Seconds(10), absl::Seconds(5)};
  std::unique_ptr<SqliteKvStore> kv_;
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(RegistryTest, EveryRankGetsTheSamePlanWhenTheJobCompletes) {
  auto first = Join(Args(0, 3));
  // Nothing but the other joins can answer it, so a look now is enough.
  EXPECT_EQ(first.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "join must wait for the job to complete";
  auto second = Join(Args(-1, 3));  // any rank
  auto third = Join(Args(2, 3));
  std::vector<JoinResult> results;
  for (auto* f : {&first, &second, &third}) {
    auto r = f->get();
    ASSERT_TRUE(r.ok()) << r.status();
    results.push_back(*r);
  }
  EXPECT_EQ(results[1].rank, 1);
  for (const JoinResult& r : results) {
    EXPECT_EQ(r.generation, 1);
    EXPECT_EQ(*r.plan_bytes, *results[0].plan_bytes);
  }
  v1::PlanInputs inputs;
  ASSERT_TRUE(inputs.ParseFromString(*results[0].plan_bytes));
  auto plan = rpc::PlanFromInputs(inputs);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stage(), 2);
  EXPECT_EQ(plan->world_size(), 3);
}

TEST_F(RegistryTest, LayoutMismatchNamesBothRanksAndTheFirstTensorThatDiffers) {
  auto first = Join(Args(0, 2));
  JoinArgs other = Args(1, 2);
  other.layout = Layout(1 << 21);
  other.layout_digest = DigestOf(other.layout);
  auto r = Join(other).get();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 1's layout differs from rank 0's at tensor 0: rank 1 has 'param.0' "
                        "[262144] bf16, rank 0 has 'param.0' [131072] bf16"));
  // Options that differ are named too: here the stage.
  JoinArgs staged = Args(1, 2);
  staged.options.set_stage(3);
  r = Join(staged).get();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("rank 1 asked for stage 3; rank 0 formed the job with stage 2"));
  // Nothing was harmed: rank 1 can still join with the right layout.
  ASSERT_TRUE(Join(Args(1, 2)).get().ok());
  ASSERT_TRUE(first.get().ok());
}

TEST_F(RegistryTest, RefusalsSayWhatIsWrong) {
  auto first = Join(Args(0, 2));
  EXPECT_EQ(Join(Args(5, 2)).get().status().code(), absl::StatusCode::kInvalidArgument);
  auto taken = Join(Args(0, 2, "elsewhere")).get();
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("rank 0 is held by host 'host0'"));
  auto world = Join(Args(1, 4)).get();
  EXPECT_EQ(world.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(world.status().message()), HasSubstr("has world size 2"));
  JoinArgs lying = Args(1, 2);
  lying.layout_digest = "0000000000000000";
  EXPECT_EQ(Join(lying).get().status().code(), absl::StatusCode::kInvalidArgument);
  JoinArgs bad_id = Args(1, 2);
  bad_id.job_id = "a/b";
  EXPECT_EQ(Join(bad_id).get().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->GetPlan("nope").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Join(Args(1, 2)).get().ok());
  EXPECT_TRUE(first.get().ok());
}

TEST_F(RegistryTest, APlanOverBudgetFailsTheJoinsAndSaysWhatFits) {
  auto args0 = Args(0, 2);
  args0.budget_bytes = 1000;  // far too little for 1M parameters at stage 2
  auto first = Join(args0);
  auto second = Join(Args(1, 2)).get();
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("stage 2 needs"));
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kResourceExhausted);
  // The job can form once ranks come with enough memory.
  EXPECT_EQ(Form(2).size(), 2u);
}

TEST_F(RegistryTest, JoinDeadlineNamesTheMissingRanks) {
  auto waiting = Join(Args(0, 3), absl::Seconds(50));
  clock_.Advance(absl::Seconds(49));
  EXPECT_EQ(waiting.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  clock_.Advance(absl::Seconds(1));  // returns once the deadline's timer has run
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  auto r = waiting.get();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job llama: rank 0 waited until its deadline; 1 of 3 ranks joined "
                        "(missing: 1, 2)"));
  // Its rank is free again.
  EXPECT_EQ(Form(3).size(), 3u);
}

TEST_F(RegistryTest, ARetryOfAWaitingJoinSupersedesIt) {
  auto first = Join(Args(0, 2), absl::Seconds(10));
  auto retry = Join(Args(0, 2), absl::Seconds(30));
  auto superseded = first.get();
  EXPECT_EQ(superseded.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(superseded.status().message()), HasSubstr("superseded"));
  // The first join's deadline passes: it no longer concerns the rank, which the retry holds.
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(retry.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  ASSERT_TRUE(Join(Args(1, 2)).get().ok());
  auto r = retry.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 0);
}

TEST_F(RegistryTest, ARankLeavingBeforeTheJobFormsFreesItsRank) {
  auto waiting = Join(Args(-1, 2));
  std::promise<absl::StatusOr<int64_t>> left;
  registry_->Leave("llama", 0, [&](absl::StatusOr<int64_t> g) { left.set_value(g); });
  ASSERT_TRUE(left.get_future().get().ok());
  EXPECT_EQ(waiting.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Form(2).size(), 2u);
}

TEST_F(RegistryTest, AnswersRunOutsideTheJobLock) {
  // Each answer calls back into the registry, which takes the job's lock: under it, they would
  // deadlock.
  ASSERT_EQ(Form(2).size(), 2u);
  std::promise<absl::StatusCode> refused_leave;
  registry_->Leave("llama", 7, [&](absl::StatusOr<int64_t> g) {
    (void)registry_->Describe("llama");
    refused_leave.set_value(g.status().code());
  });
  EXPECT_EQ(refused_leave.get_future().get(), absl::StatusCode::kFailedPrecondition);
  std::promise<absl::StatusCode> refused_join;
  registry_->Join(Args(0, 2, "elsewhere"), clock_.Now() + absl::Seconds(1),
                  [&](absl::StatusOr<JoinResult> r) {
                    (void)registry_->Describe("llama");
                    refused_join.set_value(r.status().code());
                  });
  EXPECT_EQ(refused_join.get_future().get(), absl::StatusCode::kAlreadyExists);
  std::promise<int64_t> left;
  registry_->Leave("llama", 1, [&](absl::StatusOr<int64_t> g) {
    (void)registry_->Describe("llama");
    left.set_value(*g);
  });
  EXPECT_EQ(left.get_future().get(), 2);
}

TEST_F(RegistryTest, ExpiredLeaseMarksTheRankLostAndMovesTheGeneration) {
  ASSERT_EQ(Form(2).size(), 2u);
  v1::HeartbeatRequest hb;
  hb.set_job_id("llama");
  hb.set_rank(0);
  hb.set_step(7);
  clock_.Advance(absl::Seconds(12));  // within the first lease's grace
  registry_->ExpireLeases();
  ASSERT_TRUE(registry_->Heartbeat(hb).ok());
  clock_.Advance(absl::Seconds(8));  // rank 1 is now past ttl + grace; rank 0 is not
  registry_->ExpireLeases();
  auto reply = registry_->Heartbeat(hb);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->generation(), 2);
  EXPECT_EQ(reply->job_state(), v1::JOB_DEGRADED);
  ASSERT_EQ(reply->lost_ranks_size(), 1);
  EXPECT_EQ(reply->lost_ranks(0), 1);
  hb.set_rank(1);
  EXPECT_EQ(registry_->Heartbeat(hb).status().code(), absl::StatusCode::kFailedPrecondition);
  auto d = registry_->Describe("llama");
  EXPECT_EQ(d->members(1).state(), v1::MEMBER_LOST);
  EXPECT_EQ(d->members(0).step(), 7);
}

TEST_F(RegistryTest, RestartKeepsJobsAndGivesLeasesAGracePeriod) {
  const std::vector<JoinResult> formed = Form(2);
  ASSERT_EQ(formed.size(), 2u);
  Reopen();
  auto d = registry_->Describe("llama");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->summary().state(), v1::JOB_RUNNING);
  EXPECT_EQ(d->summary().generation(), 1);
  EXPECT_EQ(d->members_size(), 2);
  EXPECT_EQ(d->plan_digest(), registry_->GetPlan("llama")->plan_digest());
  clock_.Advance(absl::Seconds(14));  // less than ttl + grace
  registry_->ExpireLeases();
  EXPECT_EQ(registry_->Describe("llama")->members(0).state(), v1::MEMBER_ACTIVE);
  // A rank whose join answer was lost in the restart joins again and gets the same plan.
  auto again = Join(Args(1, 2)).get();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again->plan_bytes, *formed[1].plan_bytes);
}

TEST_F(RegistryTest, LeavingAndEndingAreDurable) {
  ASSERT_EQ(Form(2).size(), 2u);
  std::promise<absl::StatusOr<int64_t>> left;
  registry_->Leave("llama", 1, [&](absl::StatusOr<int64_t> g) { left.set_value(g); });
  EXPECT_EQ(*left.get_future().get(), 2);
  std::promise<absl::Status> ended;
  registry_->EndJob("llama", [&](absl::Status s) { ended.set_value(s); });
  ASSERT_TRUE(ended.get_future().get().ok());
  Reopen();
  EXPECT_EQ(registry_->Describe("llama")->summary().state(), v1::JOB_ENDED);
  // An ended job re-forms with another world size.
  EXPECT_EQ(Form(3).size(), 3u);
  EXPECT_EQ(registry_->Describe("llama")->summary().world_size(), 3);
}

// Every heartbeat names the ranks that left so far (the answer is kept per generation: each
// leave must show in the next heartbeat), and a re-formed job starts with none.
TEST_F(RegistryTest, HeartbeatsNameTheRanksThatLeftAfterEachLeave) {
  ASSERT_EQ(Form(4).size(), 4u);
  v1::HeartbeatRequest hb;
  hb.set_job_id("llama");
  hb.set_rank(0);
  auto left_ranks = [&]() -> std::vector<int64_t> {
    auto reply = registry_->Heartbeat(hb);
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {-1};
    return {reply->left_ranks().begin(), reply->left_ranks().end()};
  };
  auto leave = [&](int64_t rank) {
    std::promise<absl::StatusOr<int64_t>> left;
    registry_->Leave("llama", rank, [&](absl::StatusOr<int64_t> g) { left.set_value(g); });
    ASSERT_TRUE(left.get_future().get().ok());
  };
  EXPECT_EQ(left_ranks(), std::vector<int64_t>{});
  leave(2);
  EXPECT_EQ(left_ranks(), std::vector<int64_t>{2});
  EXPECT_EQ(left_ranks(), std::vector<int64_t>{2});
  leave(1);
  EXPECT_EQ(left_ranks(), (std::vector<int64_t>{1, 2}));
  // A new process joins at a rank that left: no longer a rank that left, though neither the
  // generation nor the job's state moved.
  auto rejoined = Join(Args(2, 4));
  EXPECT_EQ(left_ranks(), std::vector<int64_t>{1});
  leave(2);
  EXPECT_EQ(rejoined.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(left_ranks(), std::vector<int64_t>{1});
  leave(3);
  leave(0);
  // Every rank left: the job ended, and re-forms with no one gone.
  ASSERT_EQ(Form(2).size(), 2u);
  EXPECT_EQ(left_ranks(), std::vector<int64_t>{});
}

// A sink that keeps what it is sent, for watch tests.
class RecordingSink : public EventSink {
 public:
  void Send(const v1::JobEvent& event) override {
    MutexLock lock(&mu_);
    events_.push_back(event);
  }
  void Close(const absl::Status& status) override {
    MutexLock lock(&mu_);
    closed_ = status;
  }
  std::vector<v1::JobEvent> events() {
    MutexLock lock(&mu_);
    return events_;
  }
  std::optional<absl::Status> closed() {
    MutexLock lock(&mu_);
    return closed_;
  }

 private:
  Mutex mu_;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RegistryTest, AJoinDeclaringTheLargestWorldCostsWhatJoinedNotTheWorld) {
  options_.join_limits.max_world_size = kHardMaxWorldSize;
  Reopen();
  // At the top rank, so that nothing below it may be listed either.
  auto waiting = Join(Args(kHardMaxWorldSize - 1, kHardMaxWorldSize), absl::Seconds(30));
  auto any = Join(Args(-1, kHardMaxWorldSize), absl::Seconds(60));
  auto d = registry_->Describe("llama");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->summary().world_size(), kHardMaxWorldSize);
  ASSERT_EQ(d->members_size(), 2);
  EXPECT_EQ(d->members(0).rank(), 0);
  EXPECT_EQ(d->members(1).rank(), kHardMaxWorldSize - 1);
  EXPECT_THAT(std::string(registry_->GetPlan("llama").status().message()),
              HasSubstr("2 of 16777216 ranks joined"));
  clock_.Advance(absl::Seconds(30));
  EXPECT_THAT(std::string(waiting.get().status().message()), HasSubstr("(missing: 1, 2, 3, 4"));
  clock_.Advance(absl::Seconds(30));
  EXPECT_EQ(any.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(registry_->ListJobs().empty());
}

TEST_F(RegistryTest, AWorldOverTheLimitIsRefusedNamingTheFlag) {
  options_.join_limits.max_world_size = 8;
  Reopen();
  auto r = Join(Args(0, 9)).get();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("world size must be 1..8 (--max-world-size), got 9"));
  EXPECT_TRUE(registry_->ListJobs().empty());
  EXPECT_EQ(Form(8).size(), 8u);
}

TEST_F(RegistryTest, AJobThatNeverFormedIsRemovedOnceNobodyIsInIt) {
  // A formation the planner refuses.
  auto poor = Args(0, 1);
  poor.budget_bytes = 1000;
  EXPECT_EQ(Join(poor).get().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(registry_->ListJobs().empty());
  EXPECT_FALSE(registry_->JobExists("llama"));
  // A join that times out alone; its watcher is told and closed.
  auto waiting = Join(Args(0, 2), absl::Seconds(5));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(registry_->Subscribe("llama", sink).ok());
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(waiting.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(registry_->ListJobs().empty());
  EXPECT_EQ(registry_->Describe("llama").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(sink->closed().has_value());
  EXPECT_TRUE(sink->closed()->ok());
  EXPECT_EQ(sink->events().back().kind(), v1::JobEvent::JOB_ENDED);
  // A join whose rank leaves before the job forms.
  auto leaving = Join(Args(0, 2));
  std::promise<absl::StatusOr<int64_t>> left;
  registry_->Leave("llama", 0, [&](absl::StatusOr<int64_t> g) { left.set_value(g); });
  ASSERT_TRUE(left.get_future().get().ok());
  EXPECT_EQ(leaving.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(registry_->ListJobs().empty());
  // None of it is in the state either.
  Reopen();
  EXPECT_TRUE(registry_->ListJobs().empty());
  EXPECT_EQ(Form(2).size(), 2u);
}

TEST_F(RegistryTest, AJobThatFormedOnceIsEndedWhenItsReformationComesToNothing) {
  ASSERT_EQ(Form(2).size(), 2u);
  // Both ranks are lost: the job is degraded with nobody in it, and a join re-forms it.
  clock_.Advance(absl::Seconds(16));
  registry_->ExpireLeases();
  ASSERT_EQ(registry_->Describe("llama")->summary().state(), v1::JOB_DEGRADED);
  auto waiting = Join(Args(0, 3), absl::Seconds(5));
  ASSERT_EQ(registry_->Describe("llama")->summary().state(), v1::JOB_FORMING);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(waiting.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(registry_->Describe("llama")->summary().state(), v1::JOB_ENDED);
  Reopen();
  EXPECT_EQ(registry_->Describe("llama")->summary().state(), v1::JOB_ENDED);
  EXPECT_EQ(Form(3).size(), 3u);
}

TEST_F(RegistryTest, JoinsThatWouldOpenAJobPastMaxJobsAreRefusedAndEndedJobsDoNotCount) {
  options_.max_jobs = 2;
  Reopen();
  auto in = [this](const std::string& job, int64_t rank, int64_t world) {
    JoinArgs a = Args(rank, world);
    a.job_id = job;
    return a;
  };
  ASSERT_TRUE(Join(in("a", 0, 1)).get().ok());
  auto b0 = Join(in("b", 0, 2));  // forming: open too
  auto refused = Join(in("c", 0, 1)).get();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("job c: zerod has 2 open jobs, the most it takes (--max-jobs 2)"));
  EXPECT_FALSE(registry_->JobExists("c"));
  EXPECT_EQ(registry_->ListJobs().size(), 2u);
  // Joins into open jobs go on.
  ASSERT_TRUE(Join(in("b", 1, 2)).get().ok());
  ASSERT_TRUE(b0.get().ok());
  std::promise<absl::Status> ended;
  registry_->EndJob("a", [&](absl::Status s) { ended.set_value(s); });
  ASSERT_TRUE(ended.get_future().get().ok());
  ASSERT_TRUE(Join(in("c", 0, 1)).get().ok());
  // Re-forming an ended job opens it again, which counts.
  EXPECT_EQ(Join(in("a", 0, 1)).get().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_->Describe("a")->summary().state(), v1::JOB_ENDED);
}

TEST_F(RegistryTest, AHeartbeatWithAnOversizedReportIsRefusedAndNothingOfItKept) {
  ASSERT_EQ(Form(1).size(), 1u);
  v1::HeartbeatRequest hb;
  hb.set_job_id("llama");
  hb.set_rank(0);
  for (int i = 0; i < 1000; ++i) (*hb.mutable_comm_bytes())["c" + std::to_string(i)] = i;
  auto r = registry_->Heartbeat(hb);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job llama: rank 0: heartbeat comm_bytes has 1000 entries, over 64"));
  hb.clear_comm_bytes();
  (*hb.mutable_memory_bytes())[std::string(100000, 'm')] = 1;
  r = registry_->Heartbeat(hb);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("... (100000 bytes)' is longer than 64"));
  EXPECT_LT(r.status().message().size(), 300u);
  EXPECT_TRUE(registry_->Describe("llama")->members(0).memory_bytes().empty());
  EXPECT_TRUE(registry_->Describe("llama")->members(0).comm_bytes().empty());
}

}  // namespace
}  // namespace zerod::server
