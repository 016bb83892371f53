// TrainerSession against the real zerod binary, ranks as threads with their own sessions: bad
// options, the engine the session wires (checked against an unsharded Adam computed here), the
// heartbeats that carry the engine's statistics, and a failed step that comes back explained.

#include "client/trainer_session.h"

#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "runtime/common/status_macros.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using ::testing::HasSubstr;

std::vector<plan::TensorSpec> Layout() {
  return {{"w0", {6, 5}, DType::kFloat32, ""},
          {"b0", {5}, DType::kFloat32, ""},
          {"w1", {5, 9}, DType::kFloat32, ""}};
}

int64_t Numel() {
  int64_t n = 0;
  for (const plan::TensorSpec& t : Layout()) n += t.numel();
  return n;
}

float Init(int64_t i) { return std::sin(static_cast<float>(i) * 0.7f) * 0.5f; }

// Rank r's gradient at step s for global element i with parameter value w.
float Grad(int64_t r, int64_t s, int64_t i, float w) {
  return (0.5f + 0.25f * std::cos(static_cast<float>(r * 7 + s * 3 + i))) *
         (w - std::sin(static_cast<float>(r + s * 5 + i)));
}

engine::EngineOptions Options() {
  engine::EngineOptions o;
  o.adam = {1e-2, 0.9, 0.99, 1e-8, 0.0, false};
  return o;
}

// One process, no sharding: torch's Adam written out, on the gradient averaged over ranks.
std::vector<float> Reference(int64_t world, int64_t steps) {
  std::vector<float> w(static_cast<size_t>(Numel())), m(w.size()), v(w.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = Init(static_cast<int64_t>(i));
  for (int64_t s = 1; s <= steps; ++s) {
    const optim::AdamScalars k = optim::MakeAdamScalars(Options().adam, s);
    for (size_t i = 0; i < w.size(); ++i) {
      double sum = 0;
      for (int64_t r = 0; r < world; ++r) sum += Grad(r, s, static_cast<int64_t>(i), w[i]);
      const float g = static_cast<float>(sum / static_cast<double>(world));
      m[i] = m[i] * k.beta1 + k.one_minus_beta1 * g;
      v[i] = v[i] * k.beta2 + (k.one_minus_beta2 * g) * g;
      w[i] = w[i] + (-k.step_size) * (m[i] / (std::sqrt(v[i]) / k.bias2_sqrt + k.eps));
    }
  }
  return w;
}

client::SessionOptions SessionOf(const ZerodHarness& zerod, const std::string& job, int64_t rank,
                                 int64_t world, int stage) {
  client::SessionOptions o;
  o.endpoint = zerod.endpoint();
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  o.layout = Layout();
  o.plan_options.stage = stage;
  o.plan_options.param_dtype = DType::kFloat32;  // fp32 training: the reference is exact Adam
  o.plan_options.grad_dtype = DType::kFloat32;
  o.plan_options.gather_unit_bytes = 64;  // several units at stage 3
  o.plan_options.reduce_bucket_bytes = 64;
  o.heartbeat_interval = absl::Milliseconds(50);
  o.join_timeout = Scaled(absl::Seconds(30));
  o.collective_timeout = Scaled(absl::Seconds(30));
  return o;
}

// One training step as a model would drive the engine: forward gathers every unit, backward
// hands in gradients last tensor first.
absl::Status TrainStep(engine::ZeroEngine& e, int64_t rank, int64_t step) {
  const std::vector<plan::TensorSpec> layout = Layout();
  std::vector<std::vector<float>> w(layout.size());
  for (int64_t u = 0; u < e.num_units(); ++u) {
    ZEROD_RETURN_IF_ERROR(e.Gather(u));
    for (size_t t = 0; t < layout.size(); ++t) {
      if (e.UnitOf(static_cast<int64_t>(t)) != u) continue;
      w[t].resize(static_cast<size_t>(layout[t].numel()));
      ZEROD_RETURN_IF_ERROR(e.ParamToFloat(static_cast<int64_t>(t), w[t].data()));
    }
    ZEROD_RETURN_IF_ERROR(e.Release(u));
  }
  std::vector<int64_t> offset = {0};
  for (const plan::TensorSpec& t : layout) offset.push_back(offset.back() + t.numel());
  for (int64_t t = static_cast<int64_t>(layout.size()) - 1; t >= 0; --t) {
    std::vector<float> g(w[static_cast<size_t>(t)].size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = Grad(rank, step, offset[static_cast<size_t>(t)] + static_cast<int64_t>(i),
                  w[static_cast<size_t>(t)][i]);
    }
    ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, g.data()));
  }
  return e.Step().status();
}

absl::Status InitParameters(engine::ZeroEngine& e) {
  const std::vector<plan::TensorSpec> layout = Layout();
  std::vector<int64_t> offset = {0};
  for (const plan::TensorSpec& t : layout) offset.push_back(offset.back() + t.numel());
  return e.InitParameters([&](int64_t t, float* out) {
    for (int64_t i = 0; i < layout[static_cast<size_t>(t)].numel(); ++i) {
      out[i] = Init(offset[static_cast<size_t>(t)] + i);
    }
  });
}

TEST(TrainerSession, MissingJobWorldOrDeviceIsAnErrorThatSaysWhatToSet) {
  ::unsetenv("ZEROD_JOB");
  ::unsetenv("ZEROD_WORLD_SIZE");
  ::unsetenv("ZEROD_RANK");
  client::SessionOptions o;
  o.endpoint = "unix:///nonexistent.sock";
  auto s = client::TrainerSession::Start(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("ZEROD_JOB"));
  o.job_id = "j";
  s = client::TrainerSession::Start(o);
  EXPECT_THAT(s.status().message(), HasSubstr("ZEROD_WORLD_SIZE"));
  ::setenv("ZEROD_WORLD_SIZE", "two", 1);
  s = client::TrainerSession::Start(o);
  EXPECT_THAT(s.status().message(), HasSubstr("ZEROD_WORLD_SIZE='two' is not an integer"));
  ::unsetenv("ZEROD_WORLD_SIZE");
  o.world_size = 1;
  o.device = "tpu:0";
  s = client::TrainerSession::Start(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("expected cpu, cuda or cuda:N, got 'tpu:0'"));
}

class EveryStage : public ::testing::TestWithParam<int> {};

TEST_P(EveryStage, TheEngineItCreatesTrainsLikeTheUnshardedRunAndHeartbeatsItsState) {
  const int stage = GetParam();
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const int64_t world = 2, steps = 3;
  std::vector<absl::Status> status(world);
  std::vector<std::vector<float>> params(world);
  std::vector<plan::MemoryBreakdown> memory(world);
  std::vector<std::map<std::string, int64_t>> sent(world);
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto session = client::TrainerSession::Start(SessionOf(zerod, "train", r, world, stage));
      if (!session.ok()) {
        status[r] = session.status();
        return;
      }
      client::TrainerSession& s = **session;
      // Every rank on one host: stage 3 pulls from shared memory, with no gather communicator.
      EXPECT_EQ(s.has_shard_exchange(), stage == 3);
      EXPECT_FALSE(s.has_gather_communicator());
      absl::StatusOr<engine::ZeroEngine*> e = s.CreateEngine(Options());
      if (!e.ok()) {
        status[r] = e.status();
        return;
      }
      EXPECT_EQ(s.engine(), *e);
      absl::StatusOr<engine::ZeroEngine*> again = s.CreateEngine(Options());
      EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
      status[r] = InitParameters(**e);
      for (int64_t step = 1; step <= steps && status[r].ok(); ++step) {
        status[r] = TrainStep(**e, r, step);
      }
      if (!status[r].ok()) return;
      absl::StatusOr<double> mean = (*e)->Average(static_cast<double>(r + 1));
      EXPECT_TRUE(mean.ok()) << mean.status();
      EXPECT_DOUBLE_EQ(mean.value_or(0), 1.5);
      absl::StatusOr<std::vector<float>> full = (*e)->FullMasterParameters();
      status[r] = full.status();
      if (full.ok()) params[r] = *full;
      memory[r] = (*e)->MemoryByCategory();
      sent[r] = (*e)->BytesSent();
      // Leave sends a last heartbeat with the engine's final state.
      if (status[r].ok()) status[r] = s.Leave();
    });
  }
  for (std::thread& t : ranks) t.join();
  const std::vector<float> want = Reference(world, steps);
  for (int64_t r = 0; r < world; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    ASSERT_EQ(params[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(params[r][i], want[i], 1e-6f * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
  absl::StatusOr<v1::JobDescription> job = zerod.Client()->DescribeJob("train");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->members_size(), world);
  for (const v1::Member& m : job->members()) {
    EXPECT_EQ(m.step(), steps) << "rank " << m.rank();
    for (int c = 0; c < plan::kMemoryCategoryCount; ++c) {
      const std::string name(plan::MemoryCategoryName(static_cast<plan::MemoryCategory>(c)));
      EXPECT_EQ(m.memory_bytes().at(name), memory[m.rank()].bytes[c]) << name;
    }
    for (const auto& [collective, bytes] : sent[m.rank()]) {
      EXPECT_EQ(m.comm_bytes().at(collective), bytes) << collective;
    }
    // Stage 3 pulls its gathers (no collective); its gradients are still reduce-scattered.
    EXPECT_GT(m.comm_bytes().at(stage == 0   ? "all_reduce"
                                : stage == 3 ? "reduce_scatter"
                                             : "all_gather"),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(TrainerSession, EveryStage, ::testing::Values(0, 1, 2, 3));

TEST(TrainerSession, AStepThatFailsBecauseARankWasLostComesBackNamingIt) {
  ZerodHarness zerod({"--lease-ttl", ScaledFlag(absl::Seconds(2)), "--restart-grace", "0s"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  absl::Status survivor;
  std::thread lost_rank([&] {
    auto session = client::TrainerSession::Start(SessionOf(zerod, "loss", 1, 2, 2));
    ASSERT_TRUE(session.ok()) << session.status();
    auto e = (*session)->CreateEngine(Options());
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(InitParameters(**e).ok());
    ASSERT_TRUE(TrainStep(**e, 1, 1).ok());
    ASSERT_TRUE((*e)->Average(0).ok());  // both ranks finished step 1
    // Gone without leaving: heartbeats stop and its connections close, as a crash would.
  });
  auto session = client::TrainerSession::Start(SessionOf(zerod, "loss", 0, 2, 2));
  ASSERT_TRUE(session.ok()) << session.status();
  auto e = (*session)->CreateEngine(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(InitParameters(**e).ok());
  ASSERT_TRUE(TrainStep(**e, 0, 1).ok());
  ASSERT_TRUE((*e)->Average(0).ok());
  lost_rank.join();
  survivor = TrainStep(**e, 0, 2);
  ASSERT_FALSE(survivor.ok());
  EXPECT_EQ(survivor.code(), absl::StatusCode::kAborted) << survivor;
  EXPECT_THAT(survivor.message(), HasSubstr("job loss: rank 1 was lost"));
}

// A rank whose script ends early leaves while its process (and session) live on: its Leave
// closes its connections, so the other's next collective fails at once and names it, instead of
// waiting for its collective timeout and then blaming a rank that did nothing wrong.
TEST(TrainerSession, AStepThatFailsBecauseARankLeftEarlyComesBackNamingIt) {
  ZerodHarness zerod({"--lease-ttl", ScaledFlag(absl::Seconds(2)), "--restart-grace", "0s"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  Notification left, done;
  std::thread leaver([&] {
    absl::StatusOr<std::unique_ptr<client::TrainerSession>> session;
    [&] {
      session = client::TrainerSession::Start(SessionOf(zerod, "early", 1, 2, 3));
      ASSERT_TRUE(session.ok()) << session.status();
      auto e = (*session)->CreateEngine(Options());
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(InitParameters(**e).ok());
      ASSERT_TRUE(TrainStep(**e, 1, 1).ok());
      ASSERT_TRUE((*e)->Average(0).ok());
      EXPECT_TRUE((*session)->Leave().ok());
    }();
    left.Notify();
    done.WaitForNotification();  // alive, its session too, until the other has failed
  });
  auto session = client::TrainerSession::Start(SessionOf(zerod, "early", 0, 2, 3));
  ASSERT_TRUE(session.ok()) << session.status();
  auto e = (*session)->CreateEngine(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(InitParameters(**e).ok());
  ASSERT_TRUE(TrainStep(**e, 0, 1).ok());
  ASSERT_TRUE((*e)->Average(0).ok());
  left.WaitForNotification();
  const absl::Time start = absl::Now();
  const absl::Status s = TrainStep(**e, 0, 2);
  done.Notify();
  leaver.join();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("job early: rank 1 has left the job")) << s;
  // The collective timeout is 30 s; released at once (20 s: a loaded machine; both scaled).
  EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(20)));
}

// A daemon gone for good: the heartbeats retry for ZEROD_RETRY_FOR from the start of the outage,
// then the session gives up, and the engine's next collective says why, naming the endpoint.
TEST(TrainerSession, ACoordinatorGoneForGoodEndsTheSessionAfterItsRetryBudget) {
  ZerodHarness zerod({"--lease-ttl", ScaledFlag(absl::Seconds(2)), "--restart-grace", "0s"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  ::setenv("ZEROD_RETRY_FOR", "1s", 1);
  auto session = client::TrainerSession::Start(SessionOf(zerod, "orphan", 0, 1, 2));
  ::unsetenv("ZEROD_RETRY_FOR");
  ASSERT_TRUE(session.ok()) << session.status();
  auto e = (*session)->CreateEngine(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(InitParameters(**e).ok());
  ASSERT_TRUE(TrainStep(**e, 0, 1).ok());
  zerod.Crash();
  absl::Status s;
  for (int64_t step = 2; step < 2000 && s.ok(); ++step) {
    s = TrainStep(**e, 0, step);
    if (s.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("job orphan: rank 0 lost its coordinator"));
  EXPECT_THAT(s.message(), HasSubstr("zerod at " + zerod.endpoint() + " unavailable for 1s"));
  // Leaving does not start a retry budget of its own (the SDK's default is a minute).
  const absl::Time start = absl::Now();
  EXPECT_EQ((*session)->Leave().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST(TrainerSession, ABadRetryBudgetIsAnErrorThatSaysWhatItWants) {
  ::setenv("ZEROD_RETRY_FOR", "soon", 1);
  client::SessionOptions o;
  o.endpoint = "unix:///nonexistent.sock";
  o.job_id = "j";
  o.world_size = 1;
  auto s = client::TrainerSession::Start(o);
  ::unsetenv("ZEROD_RETRY_FOR");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("ZEROD_RETRY_FOR='soon' is not a duration"));
}

}  // namespace
}  // namespace zerod::testing
