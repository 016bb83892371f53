#include "tests/runtime/checkpoint/engine_world.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/status_macros.h"
#include "runtime/plan/digest.h"

namespace zerod::checkpoint::testing {
namespace {

std::shared_ptr<const plan::ShardPlan> MakePlan(const std::vector<plan::TensorSpec>& layout,
                                                int stage, int64_t world, DType dtype) {
  plan::PlanInput in;
  in.tensors = layout;
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.param_dtype = dtype;
  in.options.grad_dtype = dtype;
  in.options.reduce_bucket_bytes = 400;  // several buckets
  in.options.gather_unit_bytes = 400;    // several gather units
  in.options.partition_alignment_numel = 4;
  in.options.max_live_units = 2;
  auto p = plan::ShardPlan::Create(in);
  if (!p.ok()) return nullptr;
  return std::make_shared<const plan::ShardPlan>(*std::move(p));
}

float Init(int64_t tensor, int64_t i) {
  return std::sin(static_cast<float>(tensor * 31 + i)) * 0.5f;
}

// Rank r's gradient at step s: a (w - b), with a and b from (r, s, i), so m and v differ per
// element and per step.
float Grad(int64_t r, int64_t s, int64_t global_i, float w) {
  const float a = 0.5f + 0.25f * std::cos(static_cast<float>(r * 7 + s * 3 + global_i));
  const float b = std::sin(static_cast<float>(r + s * 5 + global_i * 0.1));
  return a * (w - b);
}

absl::Status TrainStep(int64_t r, engine::ZeroEngine& e,
                       const std::vector<plan::TensorSpec>& layout) {
  const int64_t s = e.step() + 1;  // a restored engine continues with the saved one's data
  const int64_t tensors = static_cast<int64_t>(layout.size());
  std::vector<int64_t> offset = {0};
  for (const auto& t : layout) offset.push_back(offset.back() + t.numel());
  std::vector<std::vector<float>> w(layout.size());
  ZEROD_RETURN_IF_ERROR(e.ZeroGrad(/*set_to_none=*/true));
  for (int64_t u = 0; u < e.num_units(); ++u) {
    ZEROD_RETURN_IF_ERROR(e.Gather(u));
    for (int64_t t = 0; t < tensors; ++t) {
      if (e.UnitOf(t) != u) continue;
      w[t].resize(static_cast<size_t>(layout[t].numel()));
      ZEROD_RETURN_IF_ERROR(e.ParamToFloat(t, w[t].data()));
    }
    ZEROD_RETURN_IF_ERROR(e.Release(u));
  }
  for (int64_t t = tensors - 1; t >= 0; --t) {
    // Tensor 0 has no gradient at step 1, so tensors reach different step counts (Adam's
    // bias correction per tensor), which a checkpoint must bring back.
    if (t == 0 && s == 1) {
      ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, nullptr));
      continue;
    }
    std::vector<float> g(w[t].size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = Grad(r, s, offset[t] + static_cast<int64_t>(i), w[t][i]) *
             static_cast<float>(e.loss_scale());
    }
    ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, g.data()));
  }
  return e.Step().status();
}

}  // namespace

std::vector<plan::TensorSpec> SmallLayout() {
  return {{"embed", {16, 9}, DType::kFloat32, ""}, {"w0", {9, 7}, DType::kFloat32, ""},
          {"b0", {7}, DType::kFloat32, ""},        {"w1", {7, 13}, DType::kFloat32, ""},
          {"b1", {13}, DType::kFloat32, ""},       {"scale", {}, DType::kFloat32, ""},
          {"w2", {13, 11}, DType::kFloat32, ""}};
}

std::vector<plan::TensorSpec> LargeLayout() {
  return {{"embed", {1000, 800}, DType::kFloat32, ""},
          {"b", {333}, DType::kFloat32, ""},
          {"head", {800, 900}, DType::kFloat32, ""}};
}

std::string ExtraOf(int64_t rank) { return absl::StrCat("extra of rank ", rank); }

EngineWorld::EngineWorld(std::vector<plan::TensorSpec> layout, int stage, int64_t world,
                         DType dtype)
    : layout_(std::move(layout)),
      comms_(static_cast<size_t>(world)),
      engines_(static_cast<size_t>(world)) {
  static std::atomic<int> group = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("g", group++),
                                                   std::make_shared<comm::InMemoryStore>());
  auto plan = MakePlan(layout_, stage, world, dtype);
  if (plan == nullptr) {
    status_ = absl::InternalError("no plan");
    return;
  }
  std::vector<absl::Status> statuses(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      absl::Status& s = statuses[static_cast<size_t>(r)];
      auto comm = comm::GlooCommunicator::Create(store, r, world, {});
      if (!comm.ok()) {
        s = comm.status();
        return;
      }
      comms_[static_cast<size_t>(r)] = *std::move(comm);
      engine::EngineOptions options;
      options.adam = {1e-2, 0.9, 0.99, 1e-8, 0.0, false};
      if (dtype == DType::kFloat16) {
        // A scale fp16 gradients survive, which grows every other step: the scaler's state
        // changes as training goes, so a restore that lost it would show.
        options.loss_scale.initial_scale = 1024;
        options.loss_scale.growth_interval = 2;
      }
      auto e = engine::ZeroEngine::Create(plan, comms_[static_cast<size_t>(r)].get(), options);
      if (!e.ok()) {
        s = e.status();
        return;
      }
      engines_[static_cast<size_t>(r)] = *std::move(e);
      s = engines_[static_cast<size_t>(r)]->InitParameters([&](int64_t t, float* p) {
        for (int64_t i = 0; i < layout_[t].numel(); ++i) p[i] = Init(t, i);
      });
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok() && status_.ok()) status_ = s;
  }
}

EngineWorld::~EngineWorld() {
  engines_.clear();  // before the communicators they use
  comms_.clear();
}

absl::Status EngineWorld::OnEveryRank(
    const std::function<absl::Status(int64_t, engine::ZeroEngine&)>& fn) {
  ZEROD_RETURN_IF_ERROR(status_);
  std::vector<absl::Status> statuses(engines_.size());
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world(); ++r) {
    threads.emplace_back([&, r] { statuses[static_cast<size_t>(r)] = fn(r, engine(r)); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) ZEROD_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status EngineWorld::Train(int64_t steps) {
  return OnEveryRank([&](int64_t r, engine::ZeroEngine& e) -> absl::Status {
    for (int64_t s = 0; s < steps; ++s) ZEROD_RETURN_IF_ERROR(TrainStep(r, e, layout_));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<float>> EngineWorld::State(engine::StateTensor which) {
  ZEROD_RETURN_IF_ERROR(status_);
  std::vector<float> full(static_cast<size_t>(engine(0).plan().total_numel()), std::nanf(""));
  for (int64_t r = 0; r < world(); ++r) {
    for (const engine::ModelRun& run : engine(r).HeldRuns()) {
      ZEROD_RETURN_IF_ERROR(
          engine(r).ReadState(which, run, full.data() + static_cast<size_t>(run.offset)));
    }
  }
  return full;
}

absl::StatusOr<std::vector<float>> EngineWorld::FullMasterParameters() {
  std::vector<std::vector<float>> per_rank(engines_.size());
  ZEROD_RETURN_IF_ERROR(OnEveryRank([&](int64_t r, engine::ZeroEngine& e) -> absl::Status {
    ZEROD_ASSIGN_OR_RETURN(per_rank[static_cast<size_t>(r)], e.FullMasterParameters());
    return absl::OkStatus();
  }));
  return per_rank[0];
}

absl::StatusOr<Manifest> EngineWorld::Save(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<RankFile> files(engines_.size());
  ZEROD_RETURN_IF_ERROR(OnEveryRank([&](int64_t r, engine::ZeroEngine& e) -> absl::Status {
    ZEROD_ASSIGN_OR_RETURN(files[static_cast<size_t>(r)], WriteRankFile(dir, e, ExtraOf(r)));
    return absl::OkStatus();
  }));
  const engine::ZeroEngine& e = engine(0);
  Manifest m;
  m.job_id = "checkpoint-test";
  m.counters = e.counters();
  m.step = m.counters.steps_taken;
  m.world_size = world();
  m.stage = e.plan().stage();
  m.param_dtype = e.plan().options().param_dtype;
  m.grad_dtype = e.plan().options().grad_dtype;
  m.layout = e.plan().tensors();
  m.layout_digest = plan::DigestHex(plan::LayoutDigest(m.layout));
  m.plan_digest = e.plan().DigestHex();
  m.total_numel = e.plan().total_numel();
  m.files = files;
  m.user = "data loader at sample 1234";
  m.created_unix_ms = absl::ToUnixMillis(absl::Now());
  ZEROD_RETURN_IF_ERROR(WriteManifest(dir, m));
  return m;
}

absl::Status EngineWorld::Restore(const std::string& dir) {
  ZEROD_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(dir));
  return OnEveryRank(
      [&](int64_t, engine::ZeroEngine& e) { return checkpoint::Restore(dir, manifest, e); });
}

}  // namespace zerod::checkpoint::testing
