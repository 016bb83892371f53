#include "server/plan_builder.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/plan_convert.h"

namespace zerod::server {

absl::StatusOr<BuiltPlan> BuildPlan(const PlanRequest& request) {
  if (request.layout.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", request.job_id, ": no rank sent the parameter layout"));
  }
  plan::PlanInput input;
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(request.layout.begin(),
                                                          request.layout.end());
  input.tensors = rpc::FromProto(wire);
  input.options = rpc::FromProto(request.options);
  input.options.world_size = request.world_size;
  if (request.budget_bytes > 0) input.options.budget_bytes = request.budget_bytes;
  auto shard_plan = plan::ShardPlan::Create(std::move(input));
  if (!shard_plan.ok()) {
    return absl::Status(shard_plan.status().code(),
                        absl::StrCat("job ", request.job_id, ": ", shard_plan.status().message()));
  }
  BuiltPlan built;
  v1::PlanInputs& inputs = built.inputs;
  *inputs.mutable_tensors() = std::move(wire);
  inputs.set_world_size(request.world_size);
  *inputs.mutable_options() = rpc::ToProto(shard_plan->options());
  inputs.set_plan_digest(shard_plan->DigestHex());
  inputs.set_layout_digest(std::string(request.layout_digest));
  inputs.set_generation(request.generation);
  inputs.set_allocated_bytes_per_rank(shard_plan->AllocatedBytesPerRank());
  inputs.set_budget_bytes(request.budget_bytes);
  built.shard_plan = std::make_shared<const plan::ShardPlan>(*std::move(shard_plan));
  return built;
}

int64_t SmallestBudget(const std::map<int64_t, Member>& members) {
  int64_t budget = 0;
  for (const auto& [rank, m] : members) {
    if (IsLive(m) && m.budget_bytes > 0 && (budget == 0 || m.budget_bytes < budget)) {
      budget = m.budget_bytes;
    }
  }
  return budget;
}

}  // namespace zerod::server
