#ifndef ZEROD_SERVER_COORDINATOR_SERVICE_H_
#define ZEROD_SERVER_COORDINATOR_SERVICE_H_

// The Coordinator gRPC service (callback API): translates calls into JobRegistry operations.
// Joins wait inside the registry, holding no thread. With JobTokens, every call that acts on a job
// (Join, Heartbeat, Leave, EndJob, RecordCheckpoint) needs the job's token or the admin's; GetPlan
// and Watch are read-only views, open to whoever may connect.

#include <string>
#include <utility>

#include "server/auth/job_tokens.h"
#include "server/checkpoint_records.h"
#include "server/job_registry.h"
#include "zerod/v1/coordinator.grpc.pb.h"

namespace zerod::server {

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // `tokens`: null turns authentication off. `node_address`: the host other nodes reach this
  // node at (DaemonOptions::node_address), handed to the ranks that join through the socket.
  CoordinatorService(JobRegistry* registry, auth::JobTokens* tokens, CheckpointRecords* checkpoints,
                     std::string node_address)
      : registry_(registry),
        tokens_(tokens),
        checkpoints_(checkpoints),
        node_address_(std::move(node_address)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::PlanInputs* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* NodeHeartbeat(grpc::CallbackServerContext* context,
                                          const v1::NodeHeartbeatRequest* request,
                                          v1::NodeHeartbeatResponse* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* Watch(grpc::CallbackServerContext* context,
                                                const v1::WatchRequest* request) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* EndJob(grpc::CallbackServerContext* context,
                                   const v1::EndJobRequest* request,
                                   v1::EndJobResponse* response) override;
  grpc::ServerUnaryReactor* RecordCheckpoint(grpc::CallbackServerContext* context,
                                             const v1::RecordCheckpointRequest* request,
                                             v1::RecordCheckpointResponse* response) override;

 private:
  JobRegistry* const registry_;
  auth::JobTokens* const tokens_;
  CheckpointRecords* const checkpoints_;
  const std::string node_address_;
};

// The deadline a server-side wait may use: the call's own deadline less a margin so that the
// answer (not the client's timer) reports it, capped at `longest`.
absl::Time WaitDeadline(const grpc::CallbackServerContext* context, absl::Duration longest);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_COORDINATOR_SERVICE_H_
