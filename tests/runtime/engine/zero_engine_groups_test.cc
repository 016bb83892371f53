// ZeroEngine's step over parameter groups, against an unsharded torch-style Adam written out here:
// per-group hyperparameters that change between steps, tensors that no rank gives a gradient (not
// stepped, their step counts kept), tensors used on one rank only, ZeroGrad between backward and
// step, gradients summed rather than averaged over micro-steps, and the step counts a restore
// brings back. Ranks are threads with their own Gloo communicators over loopback.

#include <cmath>
#include <functional>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::engine {
namespace {

using ::testing::HasSubstr;

// Weights in group 0, biases in group 1, as a GPT recipe exempts biases from weight decay; "head"
// is the tensor some steps leave unused.
std::vector<plan::TensorSpec> Layout() {
  return {{"w0", {5, 7}, DType::kFloat32, ""},
          {"b0", {7}, DType::kFloat32, ""},
          {"w1", {7, 3}, DType::kFloat32, ""},
          {"b1", {3}, DType::kFloat32, ""},
          {"head", {3, 11}, DType::kFloat32, ""}};
}
const std::vector<int32_t> kTensorGroup = {0, 1, 0, 1, 0};
constexpr int64_t kHead = 4;

std::shared_ptr<const plan::ShardPlan> MakePlan(int stage, int64_t world) {
  plan::PlanInput in;
  in.tensors = Layout();
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.param_dtype = DType::kFloat32;
  in.options.grad_dtype = DType::kFloat32;
  in.options.reduce_bucket_bytes = 80;  // several buckets, tensors cut across slices
  in.options.gather_unit_bytes = 80;
  in.options.partition_alignment_numel = 4;
  in.options.max_live_units = 2;
  auto p = plan::ShardPlan::Create(in);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::make_shared<const plan::ShardPlan>(*std::move(p));
}

float Init(int64_t t, int64_t i) { return std::sin(static_cast<float>(t * 31 + i)) * 0.5f; }

float Grad(int64_t r, int64_t s, int64_t t, int64_t i, float w) {
  const float a = 0.5f + 0.25f * std::cos(static_cast<float>(r * 7 + s * 3 + t * 5 + i));
  return a * (w - std::sin(static_cast<float>(r + s * 5 + i) * 0.1f));
}

// Step s's hyperparameters: both groups' change every step (a schedule on lr, betas, eps and
// weight decay), so a value read once would show.
ParamGroups Groups(int64_t s) {
  ParamGroups g;
  g.configs = {{1e-2 / static_cast<double>(s), 0.9, 0.99, 1e-8, 0.1 * static_cast<double>(s), true},
               {3e-2, s >= 3 ? 0.8 : 0.9, 0.95, 1e-6 * static_cast<double>(s), 0.0, true}};
  g.tensor_group = kTensorGroup;
  return g;
}

// What a scenario does at step s on rank r.
struct Scenario {
  std::function<bool(int64_t r, int64_t s, int64_t t)> uses;  // r gives t a gradient at step s
  std::function<bool(int64_t s)> zero_grad_before_step;       // ZeroGrad after backward
  bool set_to_none = true;  // of every ZeroGrad (one before each backward, as a loop does)
  int64_t accumulation = 1;
  bool average_accumulation = true;
};

// torch's AdamW per tensor, unsharded: a tensor is stepped iff some rank gave it a gradient since
// the last zero_grad(set_to_none), with its own step count; its gradient is the sum of the
// ranks' (missing ones zero) over world (and micro-steps, when averaged).
struct Reference {
  std::vector<std::vector<float>> w, m, v;
  std::vector<int64_t> steps;

  Reference() {
    for (size_t t = 0; t < Layout().size(); ++t) {
      const int64_t n = Layout()[t].numel();
      w.emplace_back(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        w[t][static_cast<size_t>(i)] = Init(static_cast<int64_t>(t), i);
      m.emplace_back(static_cast<size_t>(n), 0.0f);
      v.emplace_back(static_cast<size_t>(n), 0.0f);
    }
    steps.assign(Layout().size(), 0);
  }

  void Run(const Scenario& sc, int64_t world, int64_t total_steps) {
    std::vector<bool> has_grad(Layout().size(), false);
    for (int64_t s = 1; s <= total_steps; ++s) {
      if (sc.set_to_none) has_grad.assign(Layout().size(), false);
      std::vector<std::vector<double>> sum(Layout().size());
      for (size_t t = 0; t < Layout().size(); ++t) sum[t].assign(w[t].size(), 0.0);
      for (int64_t micro = 0; micro < sc.accumulation; ++micro) {
        for (int64_t r = 0; r < world; ++r) {
          for (size_t t = 0; t < Layout().size(); ++t) {
            if (!sc.uses(r, s, static_cast<int64_t>(t))) continue;
            has_grad[t] = true;
            for (size_t i = 0; i < w[t].size(); ++i) {
              sum[t][i] += Grad(r, s * 10 + micro, static_cast<int64_t>(t), static_cast<int64_t>(i),
                                w[t][i]);
            }
          }
        }
      }
      if (sc.zero_grad_before_step && sc.zero_grad_before_step(s)) {
        if (sc.set_to_none) has_grad.assign(Layout().size(), false);
        for (auto& per : sum) per.assign(per.size(), 0.0);
      }
      const double divide =
          static_cast<double>(world) * (sc.average_accumulation ? sc.accumulation : 1);
      const ParamGroups groups = Groups(s);
      for (size_t t = 0; t < Layout().size(); ++t) {
        if (!has_grad[t]) continue;
        const optim::AdamConfig& c = groups.configs[static_cast<size_t>(kTensorGroup[t])];
        const optim::AdamScalars k = optim::MakeAdamScalars(c, ++steps[t]);
        for (size_t i = 0; i < w[t].size(); ++i) {
          float g = static_cast<float>(sum[t][i] / divide);
          float p = w[t][i] * k.decay_factor;
          g = g + k.weight_decay * p;
          m[t][i] = m[t][i] * k.beta1 + k.one_minus_beta1 * g;
          v[t][i] = v[t][i] * k.beta2 + (k.one_minus_beta2 * g) * g;
          w[t][i] = p + (-k.step_size) * (m[t][i] / (std::sqrt(v[t][i]) / k.bias2_sqrt + k.eps));
        }
      }
    }
  }

  std::vector<float> Flat() const {
    std::vector<float> out;
    for (const auto& t : w) out.insert(out.end(), t.begin(), t.end());
    return out;
  }
};

struct Outcome {
  std::vector<float> params;
  TrainingCounters counters;
  absl::Status status;
};

// One rank's training loop under `sc`, as the PyTorch front end drives the engine.
absl::Status TrainRank(ZeroEngine& e, const Scenario& sc, int64_t r, int64_t first_step,
                       int64_t last_step) {
  const int64_t tensors = static_cast<int64_t>(Layout().size());
  for (int64_t s = first_step; s <= last_step; ++s) {
    ZEROD_RETURN_IF_ERROR(e.ZeroGrad(sc.set_to_none));
    for (int64_t micro = 0; micro < sc.accumulation; ++micro) {
      std::vector<std::vector<float>> w(static_cast<size_t>(tensors));
      for (int64_t u = 0; u < e.num_units(); ++u) {
        ZEROD_RETURN_IF_ERROR(e.Gather(u));
        for (int64_t t = 0; t < tensors; ++t) {
          if (e.UnitOf(t) != u) continue;
          w[t].resize(static_cast<size_t>(Layout()[t].numel()));
          ZEROD_RETURN_IF_ERROR(e.ParamToFloat(t, w[t].data()));
        }
        ZEROD_RETURN_IF_ERROR(e.Release(u));
      }
      for (int64_t t = tensors - 1; t >= 0; --t) {
        if (!sc.uses(r, s, t)) {
          ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, nullptr));
          continue;
        }
        std::vector<float> g(w[t].size());
        for (size_t i = 0; i < g.size(); ++i) {
          g[i] = Grad(r, s * 10 + micro, t, static_cast<int64_t>(i), w[t][i]);
        }
        ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, g.data()));
      }
    }
    if (sc.zero_grad_before_step && sc.zero_grad_before_step(s)) {
      ZEROD_RETURN_IF_ERROR(e.ZeroGrad(sc.set_to_none));
    }
    ZEROD_RETURN_IF_ERROR(e.Step(Groups(s)).status());
  }
  return absl::OkStatus();
}

EngineOptions OptionsFor(const Scenario& sc) {
  EngineOptions o;
  o.accumulation_steps = sc.accumulation;
  o.average_accumulation = sc.average_accumulation;
  return o;
}

std::vector<Outcome> Train(int stage, int64_t world, const Scenario& sc, int64_t steps) {
  static int group = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("groups", group++),
                                                   std::make_shared<comm::InMemoryStore>());
  auto plan = MakePlan(stage, world);
  std::vector<Outcome> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Outcome& o = out[static_cast<size_t>(r)];
      o.status = [&]() -> absl::Status {
        ZEROD_ASSIGN_OR_RETURN(auto comm, comm::GlooCommunicator::Create(store, r, world, {}));
        ZEROD_ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(plan, comm.get(), OptionsFor(sc)));
        ZEROD_RETURN_IF_ERROR(e->InitParameters([](int64_t t, float* p) {
          for (int64_t i = 0; i < Layout()[t].numel(); ++i) p[i] = Init(t, i);
        }));
        ZEROD_RETURN_IF_ERROR(TrainRank(*e, sc, r, 1, steps));
        o.counters = e->counters();
        ZEROD_ASSIGN_OR_RETURN(o.params, e->FullMasterParameters());
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void ExpectMatches(const std::vector<Outcome>& got, const Reference& want,
                   const std::string& what) {
  const std::vector<float> flat = want.Flat();
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_TRUE(got[r].status.ok()) << what << " rank " << r << ": " << got[r].status;
    ASSERT_EQ(got[r].params.size(), flat.size());
    for (size_t i = 0; i < flat.size(); ++i) {
      ASSERT_NEAR(got[r].params[i], flat[i], 2e-6) << what << " rank " << r << " element " << i;
    }
    EXPECT_EQ(got[r].counters.tensor_steps, want.steps) << what << " rank " << r;
  }
}

// The head is unused by every rank at step 2 (not stepped: no decay, no moment decay, its count
// kept) and by all but the last rank at step 3 (stepped with that rank's gradient over world).
Scenario UnusedHead() {
  Scenario sc;
  sc.uses = [](int64_t r, int64_t s, int64_t t) {
    if (t != kHead) return true;
    if (s == 2) return false;
    if (s == 3) return r == 2 || r == 1;  // world 2: rank 1; world 3: ranks 1 and 2
    return true;
  };
  return sc;
}

TEST(ZeroEngineGroups, GroupsWithLiveHyperparametersAndAnUnusedTensorMatchTorch) {
  const int64_t steps = 4;
  for (int64_t world : {1, 2, 3}) {
    Scenario sc = UnusedHead();
    Reference want;
    want.Run(sc, world, steps);
    for (int stage = 0; stage <= 3; ++stage) {
      ExpectMatches(Train(stage, world, sc, steps), want,
                    absl::StrCat("stage ", stage, " world ", world));
    }
  }
}

TEST(ZeroEngineGroups, ZeroGradBetweenBackwardAndStepDiscardsTheGradients) {
  // Step 2's gradients are discarded: with set_to_none nothing is stepped at all (torch's grads
  // are None); without it every tensor steps on zeros (weight decay and moment decay only).
  for (bool set_to_none : {true, false}) {
    Scenario sc;
    sc.uses = [](int64_t, int64_t, int64_t) { return true; };
    sc.zero_grad_before_step = [](int64_t s) { return s == 2; };
    sc.set_to_none = set_to_none;
    Reference want;
    want.Run(sc, 2, 3);
    EXPECT_EQ(want.steps[0], set_to_none ? 2 : 3);
    for (int stage = 0; stage <= 3; ++stage) {
      ExpectMatches(Train(stage, 2, sc, 3), want,
                    absl::StrCat("stage ", stage, " set_to_none ", set_to_none));
    }
  }
}

TEST(ZeroEngineGroups, WithoutSetToNoneATensorOnceUsedKeepsStepping) {
  // zero_grad(set_to_none=False) keeps torch's grads as zeros: the head, used at step 1 only,
  // steps on zeros afterwards.
  Scenario sc;
  sc.uses = [](int64_t, int64_t s, int64_t t) { return t != kHead || s == 1; };
  sc.set_to_none = false;
  Reference want;
  want.Run(sc, 2, 3);
  EXPECT_EQ(want.steps[kHead], 3);
  for (int stage = 0; stage <= 3; ++stage) {
    ExpectMatches(Train(stage, 2, sc, 3), want, absl::StrCat("stage ", stage));
  }
}

TEST(ZeroEngineGroups, AccumulatedGradientsAreSummedWhenNotAveraged) {
  for (bool average : {true, false}) {
    Scenario sc = UnusedHead();
    sc.accumulation = 2;
    sc.average_accumulation = average;
    Reference want;
    want.Run(sc, 2, 3);
    for (int stage = 0; stage <= 3; ++stage) {
      ExpectMatches(Train(stage, 2, sc, 3), want,
                    absl::StrCat("stage ", stage, " average ", average));
    }
  }
}

TEST(ZeroEngineGroups, ARestoreBringsBackEachTensorsStepCount) {
  // Train 3 steps (the head skips one), copy the state out, restore it into a new engine of
  // another stage, train on: as the uninterrupted run.
  Scenario sc = UnusedHead();
  Reference want;
  want.Run(sc, 1, 5);
  auto store = std::make_shared<comm::InMemoryStore>();
  auto comm = comm::GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(comm.ok());
  auto first = ZeroEngine::Create(MakePlan(1, 1), comm->get(), {});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)
                  ->InitParameters([](int64_t t, float* p) {
                    for (int64_t i = 0; i < Layout()[t].numel(); ++i) p[i] = Init(t, i);
                  })
                  .ok());
  ASSERT_TRUE(TrainRank(**first, sc, 0, 1, 3).ok());
  const TrainingCounters saved = (*first)->counters();
  Reference at_save;
  at_save.Run(sc, 1, 3);
  EXPECT_EQ(saved.tensor_steps, at_save.steps);
  EXPECT_EQ(saved.tensor_steps, (std::vector<int64_t>{3, 3, 3, 3, 1}));
  const int64_t total = (*first)->plan().total_numel();
  std::vector<std::vector<float>> state(kStateTensorCount, std::vector<float>(total));
  for (int k = 0; k < kStateTensorCount; ++k) {
    ASSERT_TRUE((*first)->ReadState(static_cast<StateTensor>(k), {0, total}, state[k].data()).ok());
  }
  auto second = ZeroEngine::Create(MakePlan(3, 1), comm->get(), {});
  ASSERT_TRUE(second.ok());
  for (int k = 0; k < kStateTensorCount; ++k) {
    ASSERT_TRUE(
        (*second)->WriteState(static_cast<StateTensor>(k), {0, total}, state[k].data()).ok());
  }
  TrainingCounters wrong = saved;
  wrong.tensor_steps.pop_back();
  EXPECT_THAT(std::string((*second)->FinishRestore(wrong).message()),
              HasSubstr("step counts of 4 tensors restored into a model of 5"));
  wrong = saved;
  wrong.tensor_steps[0] = 9;
  EXPECT_THAT(std::string((*second)->FinishRestore(wrong).message()),
              HasSubstr("tensor step count of 9 is outside [0, 3]"));
  ASSERT_TRUE((*second)->FinishRestore(saved).ok());
  ASSERT_TRUE(TrainRank(**second, sc, 0, 4, 5).ok());
  auto full = (*second)->FullMasterParameters();
  ASSERT_TRUE(full.ok());
  const std::vector<float> flat = want.Flat();
  for (size_t i = 0; i < flat.size(); ++i) ASSERT_NEAR((*full)[i], flat[i], 2e-6) << i;
  EXPECT_EQ((*second)->counters().tensor_steps, want.steps);
}

TEST(ZeroEngineGroups, BadGroupsAreRefusedNamingTheGroupOrTensor) {
  auto store = std::make_shared<comm::InMemoryStore>();
  auto comm = comm::GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(comm.ok());
  auto e = ZeroEngine::Create(MakePlan(2, 1), comm->get(), {});
  ASSERT_TRUE(e.ok());
  ParamGroups g = Groups(1);
  g.tensor_group.pop_back();
  EXPECT_THAT(std::string((*e)->Step(g).status().message()),
              HasSubstr("groups given for 4 tensors; the model has 5"));
  g = Groups(1);
  g.tensor_group[kHead] = 2;
  EXPECT_THAT(std::string((*e)->Step(g).status().message()),
              HasSubstr("tensor 'head' is in group 2; there are 2"));
  g = Groups(1);
  g.configs[1].beta1 = 1.0;
  auto bad = (*e)->Step(g);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("group 1: beta1 is out of range"));
  // A tensor in no group keeps its values whatever its gradient.
  g = Groups(1);
  g.tensor_group.assign(5, kNotOptimized);
  std::vector<float> before(static_cast<size_t>((*e)->plan().total_numel()));
  ASSERT_TRUE(
      (*e)->ReadState(StateTensor::kMaster, {0, (*e)->plan().total_numel()}, before.data()).ok());
  for (int64_t t = 4; t >= 0; --t) {
    std::vector<float> grad(static_cast<size_t>(Layout()[t].numel()), 1.0f);
    ASSERT_TRUE((*e)->AccumulateGrad(t, grad.data()).ok());
  }
  ASSERT_TRUE((*e)->Step(g).ok());
  auto after = (*e)->FullMasterParameters();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, before);
  EXPECT_EQ((*e)->counters().tensor_steps, (std::vector<int64_t>(5, 0)));
}

TEST(ZeroEngineGroups, ZeroGradInTheMiddleOfAMicroStepIsRefused) {
  auto store = std::make_shared<comm::InMemoryStore>();
  auto comm = comm::GlooCommunicator::Create(store, 0, 1, {});
  ASSERT_TRUE(comm.ok());
  auto e = ZeroEngine::Create(MakePlan(2, 1), comm->get(), {});
  ASSERT_TRUE(e.ok());
  std::vector<float> grad(33, 1.0f);
  ASSERT_TRUE((*e)->AccumulateGrad(kHead, grad.data()).ok());
  const absl::Status s = (*e)->ZeroGrad(true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("middle of a micro-step (1 of 5 gradients"));
}

}  // namespace
}  // namespace zerod::engine
