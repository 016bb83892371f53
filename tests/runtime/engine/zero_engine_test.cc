// ZeroEngine at stages 0-3, world sizes 1-4 (3 does not divide the parameter count), fp32, bf16
// and fp16, against a single-process Adam on the same data computed here: real ranks are threads
// with their own Gloo communicators over loopback.

#include "runtime/engine/zero_engine.h"

#include <cmath>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/half.h"
#include "runtime/common/status_macros.h"
#include "tests/util/test_time.h"

namespace zerod::engine {
namespace {

using ::testing::HasSubstr;
using ::zerod::testing::Scaled;

std::vector<plan::TensorSpec> Layout() {
  return {{"w0", {5, 7}, DType::kFloat32, ""},
          {"b0", {7}, DType::kFloat32, ""},
          {"w1", {7, 3}, DType::kFloat32, ""},
          {"b1", {3}, DType::kFloat32, ""},
          {"w2", {3, 11}, DType::kFloat32, ""}};
}

std::shared_ptr<const plan::ShardPlan> MakePlan(int stage, int64_t world, DType dtype) {
  plan::PlanInput in;
  in.tensors = Layout();
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.param_dtype = dtype;
  in.options.grad_dtype = dtype;
  in.options.reduce_bucket_bytes = 80;  // several buckets
  in.options.gather_unit_bytes = 80;    // several gather units
  in.options.partition_alignment_numel = 4;
  in.options.max_live_units = 2;
  auto p = plan::ShardPlan::Create(in);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::make_shared<const plan::ShardPlan>(*std::move(p));
}

float Init(int64_t tensor, int64_t i) {
  return std::sin(static_cast<float>(tensor * 31 + i)) * 0.5f;
}

// The data-dependent gradient of rank r at step s: a (w - b), with a and b from (r, s, i).
float Grad(int64_t r, int64_t s, int64_t global_i, float w) {
  const float a = 0.5f + 0.25f * std::cos(static_cast<float>(r * 7 + s * 3 + global_i));
  const float b = std::sin(static_cast<float>(r + s * 5 + global_i * 0.1));
  return a * (w - b);
}

// Parameter w after Adam's first step with gradient g (m and v start at zero), in the order of
// operations Reference uses.
float FirstAdamStep(const optim::AdamScalars& k, float w, float g) {
  const float m = k.one_minus_beta1 * g;
  const float v = (k.one_minus_beta2 * g) * g;
  return w + (-k.step_size) * (m / (std::sqrt(v) / k.bias2_sqrt + k.eps));
}

float RoundTo(DType d, float x) {
  if (d == DType::kBFloat16) return Bf16ToFloat(FloatToBf16(x));
  if (d == DType::kFloat16) return Fp16ToFloat(FloatToFp16(x));
  return x;
}

// Single-process reference: fp32 master, the model sees parameters rounded to `dtype`, gradients
// rounded to `dtype` and averaged over ranks, then torch's Adam written out in float.
std::vector<float> Reference(int64_t world, int64_t steps, DType dtype,
                             const optim::AdamConfig& c) {
  std::vector<float> w, m, v;
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t i = 0; i < Layout()[t].numel(); ++i) w.push_back(Init(t, i));
  }
  m.assign(w.size(), 0.0f);
  v.assign(w.size(), 0.0f);
  for (int64_t s = 1; s <= steps; ++s) {
    const optim::AdamScalars k = optim::MakeAdamScalars(c, s);
    for (size_t i = 0; i < w.size(); ++i) {
      double sum = 0;
      for (int64_t r = 0; r < world; ++r) {
        sum += RoundTo(dtype, Grad(r, s, static_cast<int64_t>(i), RoundTo(dtype, w[i])));
      }
      const float g = static_cast<float>(sum / static_cast<double>(world));
      m[i] = m[i] * k.beta1 + k.one_minus_beta1 * g;
      v[i] = v[i] * k.beta2 + (k.one_minus_beta2 * g) * g;
      w[i] = w[i] + (-k.step_size) * (m[i] / (std::sqrt(v[i]) / k.bias2_sqrt + k.eps));
    }
  }
  return w;
}

struct RankOutcome {
  std::vector<float> params;
  plan::MemoryBreakdown memory;
  int64_t allocated = 0;
  std::map<std::string, int64_t> sent;
  std::map<std::string, int64_t> gather_comm_sent;  // what the gather communicator sent
  absl::Status status;
};

// Trains `steps` steps on `world` ranks; returns each rank's final full parameters. With
// `gather_comm`, every rank gives the engine a second Gloo communicator for stage-3 gathers.
std::vector<RankOutcome> Train(int stage, int64_t world, DType dtype, int64_t steps,
                               EngineOptions options, bool gather_comm = false) {
  static int group = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("g", group++),
                                                   std::make_shared<comm::InMemoryStore>());
  auto plan = MakePlan(stage, world, dtype);
  std::vector<RankOutcome> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& o = out[static_cast<size_t>(r)];
      auto comm = comm::GlooCommunicator::Create(store, r, world, {});
      if (!comm.ok()) {
        o.status = comm.status();
        return;
      }
      std::unique_ptr<comm::GlooCommunicator> gathers;
      EngineOptions rank_options = options;
      if (gather_comm) {
        auto g = comm::GlooCommunicator::Create(
            std::make_shared<comm::PrefixStore>("gather", store), r, world, {});
        if (!g.ok()) {
          o.status = g.status();
          return;
        }
        gathers = *std::move(g);
        rank_options.gather_comm = gathers.get();
      }
      auto engine = ZeroEngine::Create(plan, comm->get(), rank_options);
      if (!engine.ok()) {
        o.status = engine.status();
        return;
      }
      ZeroEngine& e = **engine;
      o.status = e.InitParameters([](int64_t t, float* p) {
        for (int64_t i = 0; i < Layout()[t].numel(); ++i) p[i] = Init(t, i);
      });
      std::vector<int64_t> offset = {0};
      for (const auto& t : Layout()) offset.push_back(offset.back() + t.numel());
      for (int64_t s = 1; s <= steps && o.status.ok(); ++s) {
        // Forward touches every unit; backward goes last tensor first.
        std::vector<std::vector<float>> w(5);
        for (int64_t u = 0; u < e.num_units() && o.status.ok(); ++u) {
          o.status = e.Gather(u);
          for (int64_t t = 0; t < 5 && o.status.ok(); ++t) {
            if (e.UnitOf(t) != u) continue;
            w[t].resize(static_cast<size_t>(Layout()[t].numel()));
            o.status = e.ParamToFloat(t, w[t].data());
          }
          if (o.status.ok()) o.status = e.Release(u);
        }
        for (int64_t t = 4; t >= 0 && o.status.ok(); --t) {
          std::vector<float> g(w[t].size());
          for (size_t i = 0; i < g.size(); ++i) {
            g[i] = Grad(r, s, offset[t] + static_cast<int64_t>(i), w[t][i]) *
                   static_cast<float>(e.loss_scale());
          }
          o.status = e.AccumulateGrad(t, g.data());
        }
        if (o.status.ok()) {
          auto stepped = e.Step();
          o.status = stepped.status();
        }
      }
      o.sent = e.BytesSent();
      if (gathers) o.gather_comm_sent = gathers->BytesSent();
      o.memory = e.MemoryByCategory();
      o.allocated = e.AllocatedBytes();
      if (o.status.ok()) {
        auto full = e.FullMasterParameters();
        o.status = full.status();
        if (full.ok()) o.params = *full;
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

EngineOptions Options(DType dtype) {
  EngineOptions o;
  o.adam = {1e-2, 0.9, 0.99, 1e-8, 0.0, false};
  if (dtype == DType::kFloat16) o.loss_scale.initial_scale = 1024;
  return o;
}

TEST(ZeroEngine, EveryStageWorldSizeAndDtypeMatchesTheReference) {
  const int64_t steps = 3;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t world : {1, 2, 3, 4}) {
      const std::vector<float> want = Reference(world, steps, dtype, Options(dtype).adam);
      for (int stage = 0; stage <= 3; ++stage) {
        SCOPED_TRACE(absl::StrCat("stage ", stage, " world ", world, " ", DTypeName(dtype)));
        const auto outcome = Train(stage, world, dtype, steps, Options(dtype));
        for (const RankOutcome& o : outcome) {
          ASSERT_TRUE(o.status.ok()) << o.status;
          ASSERT_EQ(o.params.size(), want.size());
          double worst = 0;
          for (size_t i = 0; i < want.size(); ++i) {
            worst = std::max(worst, std::fabs(static_cast<double>(o.params[i]) - want[i]));
          }
          if (dtype == DType::kFloat32 && world == 1) {
            EXPECT_EQ(o.params, want) << "same order of operations: bitwise";
          } else if (dtype == DType::kFloat32) {
            EXPECT_LT(worst, 1e-5) << "fp32 rounding of another reduction order";
          } else {
            // 16-bit gradients, summed in 16 bits hop by hop: a few ulps of bf16 per step,
            // against Adam steps of lr = 1e-2.
            EXPECT_LT(worst, 3 * 1e-2 * 0.05) << "worst " << worst;
          }
          EXPECT_EQ(o.params, outcome[0].params) << "every rank ends with the same parameters";
        }
      }
    }
  }
}

TEST(ZeroEngine, StageThreeWithItsOwnGatherCommunicatorMatchesTheReference) {
  const int64_t steps = 3;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t world : {1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("world ", world, " ", DTypeName(dtype)));
      const std::vector<float> want = Reference(world, steps, dtype, Options(dtype).adam);
      const auto shared = Train(3, world, dtype, steps, Options(dtype));
      const auto separate = Train(3, world, dtype, steps, Options(dtype), /*gather_comm=*/true);
      for (size_t r = 0; r < separate.size(); ++r) {
        ASSERT_TRUE(separate[r].status.ok()) << separate[r].status;
        ASSERT_EQ(separate[r].params.size(), want.size());
        // Gathers only move parameters: where they run changes no number.
        EXPECT_EQ(separate[r].params, shared[r].params) << "rank " << r;
        EXPECT_EQ(separate[r].sent, shared[r].sent) << "both communicators' bytes are counted";
        if (world > 1) {
          EXPECT_GT(separate[r].sent.at("all_gather"), 0);
          EXPECT_EQ(
              separate[r].gather_comm_sent,
              (std::map<std::string, int64_t>{{"all_gather", separate[r].sent.at("all_gather")}}))
              << "every gather ran on the gather communicator, nothing else did";
        }
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(separate[r].params[i], want[i], dtype == DType::kFloat32 ? 1e-5 : 1.5e-3);
        }
      }
    }
  }
}

TEST(ZeroEngine, AGatherCommunicatorOfAnotherShapeIsRefused) {
  auto store = std::make_shared<comm::InMemoryStore>();
  auto main = comm::GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(main.ok()) << main.status();
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> peer_comm;
  std::thread peer([&] {
    peer_comm =
        comm::GlooCommunicator::Create(std::make_shared<comm::PrefixStore>("two", store), 1, 2, {});
  });
  auto two =
      comm::GlooCommunicator::Create(std::make_shared<comm::PrefixStore>("two", store), 0, 2, {});
  peer.join();
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(peer_comm.ok()) << peer_comm.status();
  EngineOptions options;
  options.gather_comm = two->get();
  auto e = ZeroEngine::Create(MakePlan(3, 1, DType::kFloat32), main->get(), options);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e.status().message()),
              HasSubstr("gather communicator is rank 0 of 2, the main one rank 0 of 1"));
}

TEST(ZeroEngine, MemoryIsWhatThePlanSays) {
  for (int stage = 0; stage <= 3; ++stage) {
    const auto outcome = Train(stage, 3, DType::kBFloat16, 1, Options(DType::kBFloat16));
    auto plan = MakePlan(stage, 3, DType::kBFloat16);
    for (int64_t r = 0; r < 3; ++r) {
      const RankOutcome& o = outcome[static_cast<size_t>(r)];
      ASSERT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(o.allocated, plan->AllocatedBytesPerRank()) << "stage " << stage;
      EXPECT_EQ(o.memory.bytes, plan->MemoryForRank(r).bytes) << "stage " << stage << " rank " << r;
    }
  }
}

TEST(ZeroEngine, BytesPerStepFollowThePlan) {
  std::map<int, int64_t> per_stage;
  for (int stage = 0; stage <= 3; ++stage) {
    const auto outcome = Train(stage, 2, DType::kBFloat16, 1, Options(DType::kBFloat16));
    ASSERT_TRUE(outcome[0].status.ok()) << outcome[0].status;
    int64_t sent = 0;
    for (const auto& [name, bytes] : outcome[0].sent) sent += bytes;
    // (Counted before the test's FullMasterParameters, which is not part of a step.)
    auto plan = MakePlan(stage, 2, DType::kBFloat16);
    // Besides the plan's traffic, the step's agreement: an all-reduce of the overflow flag, the
    // squared norm and a flag per tensor (ring: twice (W - 1) / W of its bytes).
    sent -= 2 * (2 + static_cast<int64_t>(Layout().size())) * 4 / 2;
    per_stage[stage] = sent;
    // Stage 3 gathers every unit once in this test's forward; training gathers again for
    // backward, which the planner counts: compare the reduction and the update separately.
    if (stage < 3) {
      EXPECT_EQ(sent, plan->CommPerStep().Total()) << "stage " << stage;
    } else {
      EXPECT_EQ(sent, plan->CommPerStep().reduce_scatter_bytes +
                          plan->CommPerStep().all_gather_bytes / 2);
    }
  }
  // Stages 1 and 2 move what stage 0's all-reduce moves, up to their partition padding.
  EXPECT_NEAR(static_cast<double>(per_stage[1]) / per_stage[0], 1.0, 0.15);
  EXPECT_EQ(per_stage[1], per_stage[2]);
}

// Runs `body(rank, engine)` on `world` ranks with their own communicators.
void OnEngines(int stage, int64_t world, DType dtype, EngineOptions options,
               const std::function<void(int64_t, ZeroEngine&)>& body) {
  static int group = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("e", group++),
                                                   std::make_shared<comm::InMemoryStore>());
  if (options.check_store == nullptr) options.check_store = store;
  auto plan = MakePlan(stage, world, dtype);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm =
          comm::GlooCommunicator::Create(store, r, world, {"127.0.0.1", Scaled(absl::Seconds(5))});
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto engine = ZeroEngine::Create(plan, comm->get(), options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      ASSERT_TRUE((*engine)
                      ->InitParameters([](int64_t t, float* p) {
                        for (int64_t i = 0; i < Layout()[t].numel(); ++i) p[i] = Init(t, i);
                      })
                      .ok());
      body(r, **engine);
    });
  }
  for (auto& t : threads) t.join();
}

// Feeds every tensor's gradient, last first; `poison` puts an inf into tensor 0's.
absl::Status Backward(ZeroEngine& e, int64_t r, int64_t s, bool poison = false) {
  int64_t offset = 0;
  std::vector<int64_t> offsets;
  for (const auto& t : Layout()) {
    offsets.push_back(offset);
    offset += t.numel();
  }
  for (int64_t t = 4; t >= 0; --t) {
    std::vector<float> w(static_cast<size_t>(Layout()[t].numel()));
    ZEROD_RETURN_IF_ERROR(e.Gather(e.UnitOf(t)));
    ZEROD_RETURN_IF_ERROR(e.ParamToFloat(t, w.data()));
    ZEROD_RETURN_IF_ERROR(e.Release(e.UnitOf(t)));
    std::vector<float> g(w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = Grad(r, s, offsets[t] + static_cast<int64_t>(i), w[i]) *
             static_cast<float>(e.loss_scale());
    }
    if (poison && t == 0) g[3] = INFINITY;
    ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, g.data()));
  }
  return absl::OkStatus();
}

TEST(ZeroEngine, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  for (int stage : {0, 2, 3}) {
    OnEngines(stage, 2, DType::kFloat16, Options(DType::kFloat16), [&](int64_t r, ZeroEngine& e) {
      auto before = e.FullMasterParameters();
      ASSERT_TRUE(before.ok());
      ASSERT_TRUE(Backward(e, r, 1, /*poison=*/r == 1).ok());
      auto result = e.Step();
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_FALSE(result->applied) << "rank " << r << " stage " << stage;
      EXPECT_EQ(*e.FullMasterParameters(), *before);
      // The next, clean step applies on both.
      ASSERT_TRUE(Backward(e, r, 2).ok());
      EXPECT_TRUE(e.Step()->applied);
    });
  }
}

TEST(ZeroEngine, ClippingAndAccumulationMatchTheReference) {
  EngineOptions options = Options(DType::kFloat32);
  options.max_grad_norm = 0.05;
  options.accumulation_steps = 2;
  for (int stage = 0; stage <= 3; ++stage) {
    OnEngines(stage, 3, DType::kFloat32, options, [&](int64_t r, ZeroEngine& e) {
      ASSERT_TRUE(Backward(e, r, 1).ok());
      ASSERT_TRUE(Backward(e, r, 2).ok());  // second micro-step, other data
      auto result = e.Step();
      ASSERT_TRUE(result.ok()) << result.status();
      // Reference: mean over 3 ranks x 2 micro-steps, clipped by the global norm, one Adam step.
      std::vector<float> w, g;
      for (int64_t t = 0; t < 5; ++t) {
        for (int64_t i = 0; i < Layout()[t].numel(); ++i) w.push_back(Init(t, i));
      }
      double norm2 = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        double sum = 0;
        for (int64_t q = 0; q < 3; ++q) {
          for (int64_t s = 1; s <= 2; ++s) sum += Grad(q, s, static_cast<int64_t>(i), w[i]);
        }
        g.push_back(static_cast<float>(sum / 6));
        norm2 += static_cast<double>(g.back()) * g.back();
      }
      const double norm = std::sqrt(norm2);
      EXPECT_NEAR(result->grad_norm, norm, 1e-5 * norm);
      ASSERT_GT(norm, 0.05) << "the test must actually clip";
      const float coef = static_cast<float>(0.05 / (norm + 1e-6));
      const optim::AdamScalars k = optim::MakeAdamScalars(options.adam, 1);
      auto got = e.FullMasterParameters();
      ASSERT_TRUE(got.ok());
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_NEAR((*got)[i], FirstAdamStep(k, w[i], g[i] * coef), 2e-6)
            << "stage " << stage << " element " << i;
      }
    });
  }
}

TEST(ZeroEngine, ADivergedCollectiveOrderIsReportedWithTheRanks) {
  EngineOptions options = Options(DType::kBFloat16);
  options.collective_timeout = Scaled(absl::Seconds(2));
  OnEngines(3, 2, DType::kBFloat16, options, [&](int64_t r, ZeroEngine& e) {
    // Rank 1 gathers unit 1 where rank 0 gathers unit 0: the SPMD order is broken. Each gather
    // takes its prefetch along (units 1 and 2 on rank 1, 0 and 1 on rank 0): the logs part at #2.
    const absl::Status s = e.Gather(r == 0 ? 0 : 1);
    ASSERT_FALSE(s.ok()) << "rank " << r;
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective order diverged"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("rank 1 at #2 all_gather(bf16 x 20) vs rank 0 at #2 all_gather(bf16 x "
                          "16)"));
  });
}

// Six fp32 tensors of 4 elements in segments of two: {t0, t1}, {t2, t3}, {t4, t5}; two bucket
// buffers.
std::shared_ptr<const plan::ShardPlan> PairPlan(int stage, int64_t world) {
  plan::PlanInput in;
  for (int i = 0; i < 6; ++i)
    in.tensors.push_back({absl::StrCat("t", i), {4}, DType::kFloat32, ""});
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.param_dtype = DType::kFloat32;
  in.options.grad_dtype = DType::kFloat32;
  in.options.reduce_bucket_bytes = 32;
  in.options.gather_unit_bytes = 32;
  in.options.partition_alignment_numel = 2;
  in.options.bucket_buffers = 2;
  auto p = plan::ShardPlan::Create(in);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::make_shared<const plan::ShardPlan>(*std::move(p));
}

float PairInit(int64_t i) { return std::cos(static_cast<float>(i)) * 0.5f; }
float PairGrad(int64_t r, int64_t i) { return std::sin(static_cast<float>(3 * r + i)) * 0.1f; }

// One step on `world` ranks with gradients given in `order`; each rank's parameters after it, or
// the first error.
std::vector<absl::StatusOr<std::vector<float>>> StepInOrder(int stage, int64_t world,
                                                            const std::vector<int64_t>& order) {
  static int group = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("pair", group++),
                                                   std::make_shared<comm::InMemoryStore>());
  auto plan = PairPlan(stage, world);
  std::vector<absl::StatusOr<std::vector<float>>> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      out[static_cast<size_t>(r)] = [&]() -> absl::StatusOr<std::vector<float>> {
        ZEROD_ASSIGN_OR_RETURN(auto comm, comm::GlooCommunicator::Create(store, r, world, {}));
        ZEROD_ASSIGN_OR_RETURN(auto e,
                               ZeroEngine::Create(plan, comm.get(), Options(DType::kFloat32)));
        ZEROD_RETURN_IF_ERROR(e->InitParameters([](int64_t t, float* p) {
          for (int64_t i = 0; i < 4; ++i) p[i] = PairInit(4 * t + i);
        }));
        for (int64_t t : order) {
          std::vector<float> g(4);
          for (int64_t i = 0; i < 4; ++i) g[static_cast<size_t>(i)] = PairGrad(r, 4 * t + i);
          ZEROD_RETURN_IF_ERROR(e->AccumulateGrad(t, g.data()));
        }
        ZEROD_RETURN_IF_ERROR(e->Step().status());
        return e->FullMasterParameters();
      }();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ZeroEngine, SegmentsFilledOutOfOrderTakeAFreeBucketBuffer) {
  // t5 opens segment 2 in bucket 0, t3 segment 1 in bucket 1, which t2 completes. t1 opens
  // segment 0 while segment 2 still fills bucket 0: it must wait for bucket 1, not share bucket 0.
  // Or: t5, t4 fill segment 2, whose reduce-scatter is held back for a group while bucket 1 is
  // free; t3 opens segment 1 there, and t1 segment 0: the held bucket must go and be reused.
  const std::vector<std::vector<int64_t>> orders = {{5, 3, 2, 1, 0, 4}, {5, 4, 3, 1, 2, 0}};
  const optim::AdamScalars k = optim::MakeAdamScalars(Options(DType::kFloat32).adam, 1);
  for (const std::vector<int64_t>& interleaved : orders)
    for (int stage : {2, 3}) {
      SCOPED_TRACE(absl::StrCat("stage ", stage, ", order ", absl::StrJoin(interleaved, " ")));
      const auto got = StepInOrder(stage, 2, interleaved);
      const auto in_order = StepInOrder(stage, 2, {5, 4, 3, 2, 1, 0});
      for (size_t r = 0; r < got.size(); ++r) {
        ASSERT_TRUE(got[r].ok()) << got[r].status();
        ASSERT_TRUE(in_order[r].ok()) << in_order[r].status();
        EXPECT_EQ(*got[r], *in_order[r]) << "rank " << r << ": the order changes no bit";
        ASSERT_EQ(got[r]->size(), 24u);
        for (int64_t i = 0; i < 24; ++i) {
          const float g =
              static_cast<float>((static_cast<double>(PairGrad(0, i)) + PairGrad(1, i)) / 2);
          ASSERT_NEAR((*got[r])[static_cast<size_t>(i)], FirstAdamStep(k, PairInit(i), g), 2e-6)
              << "element " << i;
        }
      }
    }
}

TEST(ZeroEngine, MoreSegmentsFillingThanBucketBuffersIsAnError) {
  // Segments 2 and 1 hold both bucket buffers, half filled, when segment 0's first gradient comes.
  const auto got = StepInOrder(2, 1, {5, 3, 1});
  ASSERT_FALSE(got[0].ok());
  EXPECT_EQ(got[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(got[0].status().message()),
              HasSubstr("gradient of segment 0 arrived while all 2 bucket buffers (plan "
                        "bucket_buffers) are still filling segments 2, 1"));
}

TEST(ZeroEngine, UsingAUnitBeforeGatherIsAnError) {
  auto store = std::make_shared<comm::InMemoryStore>();
  auto comm = comm::GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(comm.ok());
  auto engine = ZeroEngine::Create(MakePlan(3, 1, DType::kBFloat16), comm->get(), {});
  ASSERT_TRUE(engine.ok());
  auto view = (*engine)->Param(0);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(view.status().message()), HasSubstr("used before Gather"));
  EXPECT_EQ((*engine)->Release(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ZeroEngine, InitParametersFromTakesTheRootsValuesOnEveryRank) {
  // Rank 1's own values differ (a module initialised with another seed); after the broadcast
  // both ranks hold rank 0's, at every stage, and Broadcast carries other state the same way.
  for (int stage : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("init", stage),
                                                     std::make_shared<comm::InMemoryStore>());
    auto plan = PairPlan(stage, 2);
    std::vector<absl::StatusOr<std::vector<float>>> full(2);
    std::vector<std::vector<float>> extra(2, std::vector<float>(3));
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        full[static_cast<size_t>(r)] = [&]() -> absl::StatusOr<std::vector<float>> {
          ZEROD_ASSIGN_OR_RETURN(auto comm, comm::GlooCommunicator::Create(store, r, 2, {}));
          ZEROD_ASSIGN_OR_RETURN(auto e,
                                 ZeroEngine::Create(plan, comm.get(), Options(DType::kFloat32)));
          // Batches of at most 9 elements: two tensors of 4 each, so three broadcasts.
          ZEROD_RETURN_IF_ERROR(e->InitParametersFrom(
              0,
              [r](int64_t t, float* p) {
                for (int64_t i = 0; i < 4; ++i) p[i] = r == 0 ? PairInit(4 * t + i) : 99.0f;
              },
              /*batch_numel=*/9));
          EXPECT_EQ(e->BytesSent().at("broadcast"), r == 0 ? 24 * 4 : 0);
          std::vector<float>& mine = extra[static_cast<size_t>(r)];
          for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(10 * r + i);
          ZEROD_RETURN_IF_ERROR(e->Broadcast(mine.data(), 3, 0));
          EXPECT_EQ(e->Broadcast(mine.data(), 3, 2).code(), absl::StatusCode::kInvalidArgument);
          return e->FullMasterParameters();
        }();
      });
    }
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(full[r].ok()) << full[r].status();
      for (int64_t i = 0; i < 24; ++i) {
        EXPECT_EQ((*full[r])[static_cast<size_t>(i)], PairInit(i)) << "rank " << r << " " << i;
      }
      EXPECT_EQ(extra[r], (std::vector<float>{0, 1, 2})) << "rank " << r;
    }
  }
}

// The real Gloo communicator, with a record of the collectives issued through it: "rs 2" is one
// reduce-scatter of two buffers. (It counts; every collective still runs on Gloo.)
class CountingCommunicator final : public comm::Communicator {
 public:
  explicit CountingCommunicator(std::unique_ptr<comm::Communicator> real)
      : real_(std::move(real)) {}
  std::vector<std::string> issued;

  int64_t rank() const override { return real_->rank(); }
  int64_t world_size() const override { return real_->world_size(); }
  std::unique_ptr<comm::Work> AllReduce(void* data, int64_t count, DType dtype) override {
    issued.push_back("ar");
    return real_->AllReduce(data, count, dtype);
  }
  std::unique_ptr<comm::Work> ReduceScatter(void* data, int64_t chunk_count, DType dtype) override {
    issued.push_back("rs 1");
    return real_->ReduceScatter(data, chunk_count, dtype);
  }
  std::unique_ptr<comm::Work> AllGather(void* data, int64_t chunk_count, DType dtype) override {
    issued.push_back("ag 1");
    return real_->AllGather(data, chunk_count, dtype);
  }
  std::unique_ptr<comm::Work> ReduceScatterGroup(const std::vector<comm::ChunkedBuffer>& buffers,
                                                 DType dtype) override {
    issued.push_back(absl::StrCat("rs ", buffers.size()));
    return real_->ReduceScatterGroup(buffers, dtype);
  }
  std::unique_ptr<comm::Work> AllGatherGroup(const std::vector<comm::ChunkedBuffer>& buffers,
                                             DType dtype) override {
    issued.push_back(absl::StrCat("ag ", buffers.size()));
    return real_->AllGatherGroup(buffers, dtype);
  }
  std::unique_ptr<comm::Work> Broadcast(void* data, int64_t count, DType dtype,
                                        int64_t root) override {
    issued.push_back("bc");
    return real_->Broadcast(data, count, dtype, root);
  }
  std::unique_ptr<comm::Work> Barrier() override { return real_->Barrier(); }
  void Abort(const absl::Status& why) override { real_->Abort(why); }
  std::map<std::string, int64_t> BytesSent() const override { return real_->BytesSent(); }
  std::map<std::string, int64_t> BytesReceived() const override { return real_->BytesReceived(); }

 private:
  std::unique_ptr<comm::Communicator> real_;
};

// Segments this small cost a collective's latency, so the engine groups them: a stage-3 gather
// takes its prefetch along, and full buckets wait for the next one while another bucket buffer
// can take the segment after. Segments of 256 KiB or more go alone, as soon as they are full.
// The parameters still end where the unsharded run's do.
TEST(ZeroEngine, SmallSegmentsGoAsOneGroupedCollectiveLargeOnesAlone) {
  for (const int64_t tensor_numel : {int64_t{4}, int64_t{64} << 10}) {
    SCOPED_TRACE(absl::StrCat(tensor_numel, " floats a tensor"));
    const bool small = tensor_numel == 4;
    plan::PlanInput in;
    for (int i = 0; i < 6; ++i)
      in.tensors.push_back({absl::StrCat("t", i), {tensor_numel}, DType::kFloat32, ""});
    in.options.world_size = 2;
    in.options.stage = 3;
    in.options.param_dtype = DType::kFloat32;
    in.options.grad_dtype = DType::kFloat32;
    in.options.gather_unit_bytes = 2 * tensor_numel * 4;  // three units of two tensors
    in.options.partition_alignment_numel = 2;
    in.options.bucket_buffers = 2;
    in.options.max_live_units = 2;
    auto made = plan::ShardPlan::Create(in);
    ASSERT_TRUE(made.ok()) << made.status();
    auto plan = std::make_shared<const plan::ShardPlan>(*std::move(made));
    auto init = [&](int64_t t, int64_t i) { return PairInit(tensor_numel * t + i); };
    auto grad = [&](int64_t r, int64_t t, int64_t i) { return PairGrad(r, tensor_numel * t + i); };
    static int group = 0;
    auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("coalesce", group++),
                                                     std::make_shared<comm::InMemoryStore>());
    std::vector<std::vector<std::string>> issued(2);
    std::vector<absl::StatusOr<std::vector<float>>> full(2);
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        full[static_cast<size_t>(r)] = [&]() -> absl::StatusOr<std::vector<float>> {
          ZEROD_ASSIGN_OR_RETURN(auto gloo, comm::GlooCommunicator::Create(store, r, 2, {}));
          CountingCommunicator comm(std::move(gloo));
          ZEROD_ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(plan, &comm, Options(DType::kFloat32)));
          ZEROD_RETURN_IF_ERROR(e->InitParameters([&](int64_t t, float* p) {
            for (int64_t i = 0; i < tensor_numel; ++i) p[i] = init(t, i);
          }));
          comm.issued.clear();
          std::vector<float> g(static_cast<size_t>(tensor_numel));
          for (int64_t u = 0; u < 3; ++u) {  // forward
            ZEROD_RETURN_IF_ERROR(e->Gather(u));
            ZEROD_RETURN_IF_ERROR(e->Release(u));
          }
          for (int64_t u = 2; u >= 0; --u) {  // backward
            ZEROD_RETURN_IF_ERROR(e->Gather(u));
            for (int64_t t = 2 * u + 1; t >= 2 * u; --t) {
              for (int64_t i = 0; i < tensor_numel; ++i) g[static_cast<size_t>(i)] = grad(r, t, i);
              ZEROD_RETURN_IF_ERROR(e->AccumulateGrad(t, g.data()));
            }
            ZEROD_RETURN_IF_ERROR(e->Release(u));
          }
          ZEROD_RETURN_IF_ERROR(e->Step().status());
          issued[static_cast<size_t>(r)] = comm.issued;
          return e->FullMasterParameters();
        }();
      });
    }
    for (auto& t : threads) t.join();
    // Forward: unit 0 with unit 1 (small), or alone and then unit 1 prefetched; unit 2
    // prefetched. Backward: units 2 and 1 still gathered, unit 0 prefetched at Gather(1).
    // Reduce-scatters (small): segments 2 and 1 hold both bucket buffers, so they go together;
    // segment 0 is the micro-step's last. Large: each goes when it is full. Then the step's
    // agreement (overflow, norm, which tensors have gradients): one small all-reduce.
    const std::vector<std::string> want =
        small ? std::vector<std::string>{"ag 2", "ag 1", "ag 1", "rs 2", "rs 1", "ar"}
              : std::vector<std::string>{"ag 1", "ag 1", "ag 1", "rs 1",
                                         "ag 1", "rs 1", "rs 1", "ar"};
    const optim::AdamScalars k = optim::MakeAdamScalars(Options(DType::kFloat32).adam, 1);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(full[r].ok()) << full[r].status();
      EXPECT_EQ(issued[r], want) << "rank " << r;
      for (int64_t t = 0; t < 6; ++t) {
        for (int64_t i = 0; i < tensor_numel; ++i) {
          const float gm =
              static_cast<float>((static_cast<double>(grad(0, t, i)) + grad(1, t, i)) / 2);
          ASSERT_NEAR((*full[r])[static_cast<size_t>(tensor_numel * t + i)],
                      FirstAdamStep(k, init(t, i), gm), 2e-6)
              << "rank " << r << " tensor " << t << " element " << i;
        }
      }
    }
  }
}

// A one-rank stage-3 engine over PairPlan (three units, two gather buffers, prefetch 1).
struct OneRank {
  std::unique_ptr<comm::GlooCommunicator> comm;
  std::unique_ptr<ZeroEngine> engine;
};

OneRank StageThreeAlone() {
  OneRank one;
  auto comm = comm::GlooCommunicator::Create(std::make_shared<comm::InMemoryStore>(), 0, 1, {});
  EXPECT_TRUE(comm.ok()) << comm.status();
  one.comm = *std::move(comm);
  auto engine = ZeroEngine::Create(PairPlan(3, 1), one.comm.get(), Options(DType::kFloat32));
  EXPECT_TRUE(engine.ok()) << engine.status();
  one.engine = *std::move(engine);
  EXPECT_TRUE(one.engine
                  ->InitParameters([](int64_t t, float* p) {
                    for (int64_t i = 0; i < 4; ++i) p[i] = PairInit(4 * t + i);
                  })
                  .ok());
  return one;
}

TEST(ZeroEngine, AnUnusedPrefetchGivesWayToTheUnitAskedFor) {
  OneRank one = StageThreeAlone();
  ZeroEngine& e = *one.engine;
  ASSERT_EQ(e.num_units(), 3);
  // Unit 0, with unit 1 prefetched into the second buffer; then unit 2 is asked for instead (a
  // module tree's order is not always the order of use): the prefetch gives way.
  ASSERT_TRUE(e.Gather(0).ok());
  ASSERT_TRUE(e.Gather(2).ok());
  std::vector<float> got(4);
  ASSERT_TRUE(e.ParamToFloat(4, got.data()).ok());
  EXPECT_EQ(got[1], PairInit(17));
  EXPECT_EQ(e.Param(2).status().code(), absl::StatusCode::kFailedPrecondition);
  // Two units asked for hold both buffers: a third takes a buffer beyond the plan's, which goes
  // back at the first release (the plan's count is a budget, never a reason to fail).
  const int64_t planned = e.MemoryByCategory()[plan::MemoryCategory::kGatherBuffers];
  ASSERT_TRUE(e.Gather(1).ok());
  EXPECT_EQ(e.gather_overflows(), 1);
  EXPECT_EQ(e.peak_gather_buffers(), 3);
  EXPECT_EQ(e.MemoryByCategory()[plan::MemoryCategory::kGatherBuffers], planned * 3 / 2);
  ASSERT_TRUE(e.ParamToFloat(2, got.data()).ok());
  EXPECT_EQ(got[0], PairInit(8));
  ASSERT_TRUE(e.ParamToFloat(4, got.data()).ok()) << "unit 2 is still where it was";
  EXPECT_EQ(got[1], PairInit(17));
  ASSERT_TRUE(e.Release(0).ok());
  EXPECT_EQ(e.MemoryByCategory()[plan::MemoryCategory::kGatherBuffers], planned);
  EXPECT_EQ(e.Param(0).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.Release(1).ok());
  ASSERT_TRUE(e.Gather(0).ok()) << "in place of unit 1, within the plan's buffers";
  EXPECT_EQ(e.gather_overflows(), 1);
  EXPECT_EQ(e.MemoryByCategory()[plan::MemoryCategory::kGatherBuffers], planned);
  ASSERT_TRUE(e.ParamToFloat(0, got.data()).ok());
  EXPECT_EQ(got[3], PairInit(3));
}

TEST(ZeroEngine, StepDropsGatheredUnitsSoNoStaleCopySurvives) {
  OneRank one = StageThreeAlone();
  ZeroEngine& e = *one.engine;
  ASSERT_TRUE(e.Gather(0).ok());  // held across the step, with unit 1 prefetched
  for (int64_t t = 5; t >= 0; --t) {
    std::vector<float> g(4, 0.5f);
    ASSERT_TRUE(e.AccumulateGrad(t, g.data()).ok());
  }
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(e.Param(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.Release(1).code(), absl::StatusCode::kFailedPrecondition);
  auto master = e.FullMasterParameters();
  ASSERT_TRUE(master.ok());
  for (int64_t u = 0; u < 3; ++u) {
    ASSERT_TRUE(e.Gather(u).ok());
    for (int64_t t = 2 * u; t < 2 * u + 2; ++t) {
      std::vector<float> got(4);
      ASSERT_TRUE(e.ParamToFloat(t, got.data()).ok());
      for (int64_t i = 0; i < 4; ++i) {
        EXPECT_EQ(got[static_cast<size_t>(i)], (*master)[static_cast<size_t>(4 * t + i)]);
        EXPECT_NE(got[static_cast<size_t>(i)], PairInit(4 * t + i)) << "the step moved it";
      }
    }
    ASSERT_TRUE(e.Release(u).ok());
  }
}

// A released unit stays in its gather buffer until the buffer is needed: gathered again before
// then (backward right after forward) it costs no all-gather; the unit released longest ago is
// the one a new gather displaces. Two ranks, so every all-gather moves bytes that are counted.
TEST(ZeroEngine, AReleasedUnitGatheredAgainBeforeItsBufferIsNeededCostsNoAllGather) {
  static int group = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("cache", group++),
                                                   std::make_shared<comm::InMemoryStore>());
  auto plan = PairPlan(3, 2);  // three units of 2 tensors (8 floats), two gather buffers
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      status[static_cast<size_t>(r)] = [&]() -> absl::Status {
        ZEROD_ASSIGN_OR_RETURN(auto comm, comm::GlooCommunicator::Create(store, r, 2, {}));
        ZEROD_ASSIGN_OR_RETURN(auto e,
                               ZeroEngine::Create(plan, comm.get(), Options(DType::kFloat32)));
        ZEROD_RETURN_IF_ERROR(e->InitParameters([](int64_t t, float* p) {
          for (int64_t i = 0; i < 4; ++i) p[i] = PairInit(4 * t + i);
        }));
        // All-gathers issued so far, landed: Average is a collective on the same communicator,
        // which runs collectives in order.
        auto gathered = [&] {
          EXPECT_TRUE(e->Average(0.0).ok());
          return e->BytesSent()["all_gather"];
        };
        const int64_t one_unit = 4 * 4;  // each rank sends its half of a unit's 8 floats
        auto expect_values = [&](int64_t unit) -> absl::Status {
          for (int64_t t = 2 * unit; t < 2 * unit + 2; ++t) {
            std::vector<float> got(4);
            ZEROD_RETURN_IF_ERROR(e->ParamToFloat(t, got.data()));
            for (int64_t i = 0; i < 4; ++i)
              EXPECT_EQ(got[static_cast<size_t>(i)], PairInit(4 * t + i));
          }
          return absl::OkStatus();
        };
        const int64_t before = gathered();
        ZEROD_RETURN_IF_ERROR(e->Gather(0));  // unit 0, and unit 1 prefetched
        EXPECT_EQ(gathered() - before, 2 * one_unit);
        ZEROD_RETURN_IF_ERROR(e->Release(0));
        ZEROD_RETURN_IF_ERROR(e->Gather(0));  // still there
        EXPECT_EQ(gathered() - before, 2 * one_unit) << "a unit still in its buffer is reused";
        ZEROD_RETURN_IF_ERROR(expect_values(0));
        EXPECT_EQ(e->Release(1).code(), absl::StatusCode::kFailedPrecondition)
            << "unit 1 was prefetched, never asked for";
        ZEROD_RETURN_IF_ERROR(e->Release(0));
        EXPECT_EQ(e->Release(0).code(), absl::StatusCode::kFailedPrecondition) << "released twice";
        ZEROD_RETURN_IF_ERROR(e->Gather(1));  // the prefetch; unit 2 displaces unit 0
        EXPECT_EQ(gathered() - before, 3 * one_unit);
        ZEROD_RETURN_IF_ERROR(expect_values(1));
        ZEROD_RETURN_IF_ERROR(e->Release(1));
        EXPECT_EQ(e->Param(2).status().code(), absl::StatusCode::kFailedPrecondition)
            << "a released unit is not to be read, though its buffer may still hold it";
        ZEROD_RETURN_IF_ERROR(e->Gather(0));  // gone: gathered anew in place of unit 2 or 1
        EXPECT_EQ(gathered() - before, 4 * one_unit);
        ZEROD_RETURN_IF_ERROR(expect_values(0));
        // New parameter values (a state dict loaded between forwards) leave no stale unit.
        ZEROD_RETURN_IF_ERROR(e->Release(0));
        ZEROD_RETURN_IF_ERROR(e->InitParameters([](int64_t, float* p) {
          for (int64_t i = 0; i < 4; ++i) p[i] = 42.0f;
        }));
        ZEROD_RETURN_IF_ERROR(e->Gather(0));
        std::vector<float> got(4);
        ZEROD_RETURN_IF_ERROR(e->ParamToFloat(0, got.data()));
        EXPECT_EQ(got, std::vector<float>(4, 42.0f)) << "the unit cached before the write is gone";
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace zerod::engine
