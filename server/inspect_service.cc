#include "server/inspect_service.h"

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/auth/call_auth.h"
#include "server/join_admission.h"

namespace zerod::server {

using rpc::ToGrpc;

grpc::ServerUnaryReactor* InspectService::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* /*request*/,
                                                   v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::AuthorizeView(tokens_, *context, ""); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  for (v1::JobSummary& s : registry_->ListJobs()) *response->add_jobs() = std::move(s);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InspectService::DescribeJob(grpc::CallbackServerContext* context,
                                                      const v1::DescribeJobRequest* request,
                                                      v1::JobDescription* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::AuthorizeView(tokens_, *context, request->job_id()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  auto d = registry_->Describe(request->job_id());
  if (d.ok()) *response = *std::move(d);
  reactor->Finish(ToGrpc(d.status()));
  return reactor;
}

grpc::ServerUnaryReactor* InspectService::ShardMap(grpc::CallbackServerContext* context,
                                                   const v1::ShardMapRequest* request,
                                                   v1::ShardMapResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::AuthorizeView(tokens_, *context, request->job_id()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  auto plan_or = registry_->ShardPlanOf(request->job_id());
  if (!plan_or.ok()) {
    reactor->Finish(ToGrpc(plan_or.status()));
    return reactor;
  }
  const plan::ShardPlan& plan = **plan_or;
  const int64_t world = plan.world_size();
  if (request->rank() < -1 || request->rank() >= world) {
    reactor->Finish(ToGrpc(absl::InvalidArgumentError(
        absl::StrCat("job ", request->job_id(), ": rank ", request->rank(),
                     " is out of range for world size ", world))));
    return reactor;
  }
  std::optional<int64_t> tensor;
  if (!request->tensor().empty()) {
    tensor = plan.FindTensor(request->tensor());
    if (!tensor) {
      reactor->Finish(ToGrpc(
          absl::NotFoundError(absl::StrCat("job ", request->job_id(), ": no tensor named '",
                                           ShownKey(request->tensor()), "' in the layout"))));
      return reactor;
    }
  }
  response->set_job_id(request->job_id());
  response->set_plan_digest(plan.DigestHex());
  response->set_stage(plan.stage());
  response->set_world_size(world);
  response->set_padded_numel(plan.padded_numel());
  response->set_shard_numel(plan.shard_numel());
  response->set_segments(static_cast<int64_t>(plan.segments().size()));
  const int64_t first = request->rank() < 0 ? 0 : request->rank();
  const int64_t last = request->rank() < 0 ? world - 1 : request->rank();
  for (int64_t r = first; r <= last; ++r) {
    v1::RankShard* shard = response->add_ranks();
    shard->set_rank(r);
    shard->set_shard_numel(plan.shard_numel());
    shard->set_real_numel(plan.OwnedRealNumel(r));
    if (request->rank() >= 0) {
      for (const plan::OwnedRange& range : plan.OwnedRanges(r)) {
        v1::OwnedRange* out = shard->add_ranges();
        out->set_segment(range.segment);
        out->set_flat_offset(range.flat_offset);
        out->set_shard_offset(range.shard_offset);
        out->set_numel(range.numel);
        out->set_real_numel(range.real_numel);
      }
    }
  }
  if (tensor) {
    response->set_tensor(request->tensor());
    for (const plan::Piece& p : plan.Pieces(*tensor)) {
      v1::Piece* out = response->add_pieces();
      out->set_owner_rank(p.owner_rank);
      out->set_shard_offset(p.shard_offset);
      out->set_tensor_offset(p.tensor_offset);
      out->set_numel(p.numel);
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* InspectService::ListCheckpoints(grpc::CallbackServerContext* context,
                                                          const v1::ListCheckpointsRequest* request,
                                                          v1::ListCheckpointsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::AuthorizeView(tokens_, *context, request->job_id()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  auto records = checkpoints_->List(request->job_id());
  if (records.ok()) {
    for (v1::CheckpointRecord& r : *records) *response->add_checkpoints() = std::move(r);
  }
  reactor->Finish(ToGrpc(records.status()));
  return reactor;
}

}  // namespace zerod::server
