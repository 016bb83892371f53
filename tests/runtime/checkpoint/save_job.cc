#include "tests/runtime/checkpoint/save_job.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/status_macros.h"
#include "tests/util/test_time.h"

namespace zerod::checkpoint::testing {
namespace {

std::shared_ptr<const plan::ShardPlan> MakePlan(int stage, int64_t world) {
  plan::PlanInput in;
  in.tensors = JobLayout();
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.param_dtype = DType::kFloat32;
  in.options.grad_dtype = DType::kFloat32;
  in.options.reduce_bucket_bytes = 80;
  in.options.gather_unit_bytes = 80;
  in.options.partition_alignment_numel = 4;
  in.options.max_live_units = 2;
  auto p = plan::ShardPlan::Create(in);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::make_shared<const plan::ShardPlan>(*std::move(p));
}

}  // namespace

std::vector<plan::TensorSpec> JobLayout() {
  return {{"w0", {5, 7}, DType::kFloat32, ""},
          {"b0", {7}, DType::kFloat32, ""},
          {"w1", {7, 3}, DType::kFloat32, ""},
          {"w2", {3, 11}, DType::kFloat32, ""}};
}

absl::Status FailureInjectingRecorder::Record(const CheckpointRecordInfo& record) {
  MutexLock lock(&mu_);
  if (fail_complete_ && record.state == RecordState::kComplete) {
    fail_complete_ = false;
    return absl::UnavailableError("failure injection: the coordinator is gone");
  }
  calls_.push_back(record);
  latest_[record.directory] = record;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointRecordInfo>> FailureInjectingRecorder::List() {
  MutexLock lock(&mu_);
  std::vector<CheckpointRecordInfo> out;
  for (const auto& [dir, r] : latest_) out.push_back(r);
  return out;
}

std::vector<CheckpointRecordInfo> FailureInjectingRecorder::calls() {
  MutexLock lock(&mu_);
  return calls_;
}

void FailureInjectingRecorder::FailNextComplete() {
  MutexLock lock(&mu_);
  fail_complete_ = true;
}

void FailureInjectingRecorder::MarkSaving(const std::string& dir) {
  MutexLock lock(&mu_);
  latest_[dir].directory = dir;
  latest_[dir].state = RecordState::kSaving;
}

absl::Status InitJobParameters(engine::ZeroEngine& e) {
  return e.InitParameters([](int64_t t, float* p) {
    for (int64_t i = 0; i < JobLayout()[t].numel(); ++i) {
      p[i] = std::sin(static_cast<float>(t * 31 + i)) * 0.5f;
    }
  });
}

std::string TempRoot() {
  std::string pattern = (std::filesystem::temp_directory_path() / "save-protocol-XXXXXX").string();
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/ckpt";
}

void RunJob(int stage, int64_t world,
            const std::function<void(int64_t, engine::ZeroEngine&, comm::Store&)>& body) {
  static int job = 0;
  auto store = std::make_shared<comm::PrefixStore>(absl::StrCat("job", job++),
                                                   std::make_shared<comm::InMemoryStore>());
  auto plan = MakePlan(stage, world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = comm::GlooCommunicator::Create(
          std::make_shared<comm::PrefixStore>("gloo", store), r, world,
          {"127.0.0.1", ::zerod::testing::Scaled(absl::Seconds(30))});
      ASSERT_TRUE(comm.ok()) << comm.status();
      engine::EngineOptions options;
      options.adam.lr = 0.01;
      auto engine = engine::ZeroEngine::Create(plan, comm->get(), options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      ASSERT_TRUE(InitJobParameters(**engine).ok());
      body(r, **engine, *store);
    });
  }
  for (auto& t : threads) t.join();
}

absl::Status TrainStep(engine::ZeroEngine& e, int64_t rank) {
  const std::vector<plan::TensorSpec> layout = JobLayout();
  for (int64_t t = static_cast<int64_t>(layout.size()) - 1; t >= 0; --t) {
    std::vector<float> w(static_cast<size_t>(layout[t].numel()));
    ZEROD_RETURN_IF_ERROR(e.Gather(e.UnitOf(t)));
    ZEROD_RETURN_IF_ERROR(e.ParamToFloat(t, w.data()));
    ZEROD_RETURN_IF_ERROR(e.Release(e.UnitOf(t)));
    std::vector<float> g(w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = w[i] - std::cos(static_cast<float>(rank + e.step() * 3 + static_cast<int64_t>(i)));
    }
    ZEROD_RETURN_IF_ERROR(e.AccumulateGrad(t, g.data()));
  }
  return e.Step().status();
}

SaveOptions Options(const std::string& root, int64_t keep_last) {
  SaveOptions o;
  o.root = root;
  o.keep_last = keep_last;
  o.job_id = "test";
  o.timeout = ::zerod::testing::Scaled(absl::Minutes(5));
  return o;
}

}  // namespace zerod::checkpoint::testing
