#include "tests/server/status/running_job.h"

#include <future>
#include <vector>

#include "gtest/gtest.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"

namespace zerod::status {

RunningJob::RunningJob() {
  kv_ = *server::SqliteKvStore::Open(dir_.path() + "/state.db", server::Durability::kNormal);
  registry_ = std::make_unique<server::JobRegistry>(
      kv_.get(), &clock_, server::RegistryOptions{absl::Seconds(10), absl::Seconds(5)});
  EXPECT_TRUE(registry_->Recover().ok());
  const server::JobRegistry* registry = registry_.get();
  checkpoints_ = std::make_unique<server::CheckpointRecords>(
      kv_.get(), &clock_,
      [registry](const std::string& job_id) {
        return registry->JobExists(job_id) ? absl::OkStatus() : registry->Missing(job_id);
      },
      server::CheckpointLimits{});
}

// The registry first: its timers answer joins; the store drains its commits last.
RunningJob::~RunningJob() {
  registry_.reset();
  kv_.reset();
}

void RunningJob::Form(const std::string& job_id, int64_t world, int stage,
                      const std::string& host) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
  rpc::ToProto(plan::SyntheticLayout(1 << 16, DType::kBFloat16, 8), &wire);
  const std::vector<v1::TensorSpec> layout(wire.begin(), wire.end());
  const std::string digest = plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
  std::vector<std::future<absl::StatusOr<server::JoinResult>>> joins;
  for (int64_t r = 0; r < world; ++r) {
    server::JoinArgs a;
    a.job_id = job_id;
    a.world_size = world;
    a.rank = r;
    a.host = host.empty() ? "host" + std::to_string(r) : host;
    a.device = "cpu";
    a.layout = layout;
    a.layout_digest = digest;
    a.options.set_stage(stage);
    auto promise = std::make_shared<std::promise<absl::StatusOr<server::JoinResult>>>();
    joins.push_back(promise->get_future());
    registry_->Join(
        std::move(a), clock_.Now() + absl::Seconds(30),
        [promise](absl::StatusOr<server::JoinResult> r) { promise->set_value(std::move(r)); });
  }
  for (auto& join : joins) {
    auto result = join.get();
    ASSERT_TRUE(result.ok()) << result.status();
  }
}

void RunningJob::Heartbeat(const std::string& job_id, int64_t rank, int64_t step,
                           int64_t comm_bytes, int64_t params_bytes) {
  v1::HeartbeatRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  request.set_generation(1);
  request.set_step(step);
  (*request.mutable_comm_bytes())["reduce_scatter"] = comm_bytes;
  if (params_bytes > 0) (*request.mutable_memory_bytes())["params"] = params_bytes;
  auto response = registry_->Heartbeat(request);
  ASSERT_TRUE(response.ok()) << response.status();
}

void RunningJob::RecordCheckpoint(const std::string& job_id, int64_t step,
                                  v1::CheckpointState state, const std::string& directory) {
  v1::CheckpointRecord record;
  record.set_step(step);
  record.set_directory(directory);
  record.set_world_size(2);
  record.set_stage(2);
  record.set_state(state);
  std::promise<absl::StatusOr<v1::CheckpointRecord>> done;
  auto future = done.get_future();
  checkpoints_->Record(job_id, record, [&done](absl::StatusOr<v1::CheckpointRecord> r) {
    done.set_value(std::move(r));
  });
  auto stored = future.get();
  ASSERT_TRUE(stored.ok()) << stored.status();
}

}  // namespace zerod::status
