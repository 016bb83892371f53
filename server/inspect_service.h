#ifndef ZEROD_SERVER_INSPECT_SERVICE_H_
#define ZEROD_SERVER_INSPECT_SERVICE_H_

// The Inspect gRPC service: read-only views of jobs, members, shard maps and checkpoint records
// for operators. It asks for no job token: who may look is who may connect (the Unix socket's mode
// and group, TLS on TCP; docs/ARCHITECTURE.md "Authentication and authorization").

#include "server/checkpoint_records.h"
#include "server/job_registry.h"
#include "zerod/v1/inspect.grpc.pb.h"

namespace zerod::server {

class InspectService final : public v1::Inspect::CallbackService {
 public:
  InspectService(const JobRegistry* registry, const CheckpointRecords* checkpoints)
      : registry_(registry), checkpoints_(checkpoints) {}

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
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_INSPECT_SERVICE_H_
