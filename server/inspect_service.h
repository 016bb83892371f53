#ifndef ZEROD_SERVER_INSPECT_SERVICE_H_
#define ZEROD_SERVER_INSPECT_SERVICE_H_

// The Inspect gRPC service: read-only views of jobs, members, shard maps and checkpoint records
// for operators. Over the Unix socket who may look is who may connect (its mode and group); over
// TCP a call needs the viewer, admin or job's token unless inspection is open (auth::AuthorizeView;
// docs/ARCHITECTURE.md "Authentication and authorization").

#include "server/auth/job_tokens.h"
#include "server/checkpoint_records.h"
#include "server/job_registry.h"
#include "zerod/v1/inspect.grpc.pb.h"

namespace zerod::server {

class InspectService final : public v1::Inspect::CallbackService {
 public:
  // `tokens`: null when authentication is off.
  InspectService(const JobRegistry* registry, const CheckpointRecords* checkpoints,
                 const auth::JobTokens* tokens)
      : registry_(registry), checkpoints_(checkpoints), tokens_(tokens) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeJob(grpc::CallbackServerContext* context,
                                        const v1::DescribeJobRequest* request,
                                        v1::JobDescription* response) override;
  grpc::ServerUnaryReactor* ShardMap(grpc::CallbackServerContext* context,
                                     const v1::ShardMapRequest* request,
                                     v1::ShardMapResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;

 private:
  const JobRegistry* const registry_;
  const CheckpointRecords* const checkpoints_;
  const auth::JobTokens* const tokens_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_INSPECT_SERVICE_H_
