#ifndef ZEROD_SERVER_INSPECT_SERVICE_H_
#define ZEROD_SERVER_INSPECT_SERVICE_H_

// The Inspect gRPC service: read-only views of jobs, members and shard maps for operators. It asks
// for no job token: who may look is who may connect (the Unix socket's mode and group, TLS on TCP;
// docs/ARCHITECTURE.md "Authentication and authorization").

#include "server/job_registry.h"
#include "zerod/v1/inspect.grpc.pb.h"

namespace zerod::server {

class InspectService final : public v1::Inspect::CallbackService {
 public:
  explicit InspectService(const JobRegistry* registry) : registry_(registry) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeJob(grpc::CallbackServerContext* context,
                                        const v1::DescribeJobRequest* request,
                                        v1::JobDescription* response) override;
  grpc::ServerUnaryReactor* ShardMap(grpc::CallbackServerContext* context,
                                     const v1::ShardMapRequest* request,
                                     v1::ShardMapResponse* response) override;

 private:
  const JobRegistry* const registry_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_INSPECT_SERVICE_H_
