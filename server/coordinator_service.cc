#include "server/coordinator_service.h"

#include <deque>
#include <memory>

#include "absl/time/clock.h"
#include "proto/grpc_status.h"
#include "runtime/common/mutex.h"
#include "server/auth/call_auth.h"
#include "server/logging.h"
#include "server/metrics/server_metrics.h"

namespace zerod::server {
namespace {

using rpc::ToGrpc;

constexpr absl::Duration kLongestJoinWait = absl::Hours(24);
constexpr size_t kMaxQueuedEvents = 4096;

// A Watch stream: queues a job's events and writes them one at a time. The registry holds the
// sink; the reactor deletes itself when gRPC is done with it, after detaching from the sink.
class WatchStream final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  class Sink final : public EventSink {
   public:
    explicit Sink(WatchStream* stream) : stream_(stream) {}

    void Send(const v1::JobEvent& event) override {
      MutexLock lock(&mu_);
      if (stream_ == nullptr || finishing_) return;
      // A slow reader loses step updates first, never membership changes.
      if (queue_.size() >= kMaxQueuedEvents && event.kind() == v1::JobEvent::STEP) return;
      queue_.push_back(event);
      if (!writing_) WriteFront();
    }
    void Close(const absl::Status& status) override {
      MutexLock lock(&mu_);
      RequestFinish(ToGrpc(status));
    }
    void WriteDone(bool ok) {
      MutexLock lock(&mu_);
      writing_ = false;
      if (!queue_.empty()) queue_.pop_front();
      if (!ok) RequestFinish(grpc::Status(grpc::StatusCode::CANCELLED, "watch stream broken"));
      // Events queued before a Close still go out (a job's end is queued behind the write in
      // flight, then the stream is closed); only a broken stream drops them.
      if (ok && !queue_.empty()) {
        WriteFront();
      } else {
        MaybeFinish();
      }
    }
    void Cancelled() {
      MutexLock lock(&mu_);
      RequestFinish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    }
    void Detach() {
      MutexLock lock(&mu_);
      stream_ = nullptr;
    }

   private:
    void WriteFront() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      writing_ = true;
      stream_->StartWrite(&queue_.front());
    }
    void RequestFinish(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stream_ == nullptr || finishing_) return;
      finishing_ = true;
      status_ = std::move(status);
      MaybeFinish();
    }
    // Finish only once, and never while a write is outstanding.
    void MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (stream_ == nullptr || !finishing_ || writing_ || finished_) return;
      finished_ = true;
      stream_->Finish(status_);
    }

    Mutex mu_;
    WatchStream* stream_ ABSL_GUARDED_BY(mu_);
    std::deque<v1::JobEvent> queue_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool finishing_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
    grpc::Status status_ ABSL_GUARDED_BY(mu_);
  };

  // `allowed`: the caller may watch the job (auth::AuthorizeView); otherwise the stream ends at
  // once with that status, having subscribed to nothing.
  WatchStream(JobRegistry* registry, const std::string& job_id, const absl::Status& allowed)
      : registry_(registry), job_id_(job_id), sink_(std::make_shared<Sink>(this)) {
    absl::StatusOr<int64_t> id =
        allowed.ok() ? registry_->Subscribe(job_id_, sink_) : absl::StatusOr<int64_t>(allowed);
    if (!id.ok()) {
      subscribed_ = false;
      sink_->Close(id.status());
      return;
    }
    watch_id_ = *id;
  }

  void OnWriteDone(bool ok) override { sink_->WriteDone(ok); }
  void OnCancel() override { sink_->Cancelled(); }
  void OnDone() override {
    sink_->Detach();
    if (subscribed_) registry_->Unsubscribe(job_id_, watch_id_);
    delete this;
  }

 private:
  JobRegistry* const registry_;
  const std::string job_id_;
  std::shared_ptr<Sink> sink_;
  bool subscribed_ = true;
  int64_t watch_id_ = 0;
};

}  // namespace

absl::Time WaitDeadline(const grpc::CallbackServerContext* context, absl::Duration longest) {
  const absl::Time now = absl::Now();
  absl::Time deadline = now + longest;
  const auto client = context->deadline();
  if (client != std::chrono::system_clock::time_point::max()) {
    const absl::Time theirs = absl::FromChrono(client);
    // Answer a little before the client gives up, so the message is ours.
    const absl::Duration margin = std::min(absl::Milliseconds(200), (theirs - now) / 10);
    deadline = std::min(deadline, theirs - margin);
  }
  return deadline;
}

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* context,
                                                   const v1::JoinRequest* request,
                                                   v1::JoinResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  JoinArgs args;
  args.job_id = request->job_id();
  args.world_size = request->world_size();
  args.rank = request->rank();
  args.host = request->host();
  args.device = request->device();
  args.budget_bytes = request->budget_bytes();
  args.layout.assign(request->layout().begin(), request->layout().end());
  args.layout_digest = request->layout_digest();
  args.options = request->options();
  // Where this rank's peers will reach it, when its node is known (the SDK's Gloo listens there).
  response->set_node_address(auth::CallerNodeAddress(tokens_, *context, node_address_));
  auto join = [this, reactor, response, deadline = WaitDeadline(context, kLongestJoinWait)](
                  JoinArgs args, absl::Status allowed) {
    if (!allowed.ok()) {
      reactor->Finish(ToGrpc(allowed));
      return;
    }
    const std::string job_id = args.job_id;
    registry_->Join(std::move(args), deadline,
                    [this, reactor, response, job_id](absl::StatusOr<JoinResult> result) {
                      if (!result.ok()) {
                        // A refused join that created nothing gives back its claim on the id.
                        if (tokens_ != nullptr) tokens_->ReleaseIfAbsent(job_id);
                        reactor->Finish(ToGrpc(result.status()));
                        return;
                      }
                      response->set_rank(result->rank);
                      response->set_generation(result->generation);
                      response->set_lease_ttl_ms(absl::ToInt64Milliseconds(result->lease_ttl));
                      response->set_world_size(result->world_size);
                      response->set_plan_inputs(*result->plan_bytes);
                      metrics::Metrics().joins.WithLabels({job_id})->Increment();
                      reactor->Finish(grpc::Status::OK);
                    });
  };
  // Malformed joins are refused before they could claim a job.
  absl::Status valid = CheckJoinArgs(args, registry_->join_limits());
  if (tokens_ == nullptr || !valid.ok()) {
    join(std::move(args), std::move(valid));
    return reactor;
  }
  const std::string job_id = args.job_id;
  tokens_->Admit(job_id, auth::CredentialsOf(*context),
                 [join, args = std::move(args)](absl::Status allowed) mutable {
                   join(std::move(args), std::move(allowed));
                 });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetPlan(grpc::CallbackServerContext* context,
                                                      const v1::GetPlanRequest* request,
                                                      v1::PlanInputs* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::AuthorizeView(tokens_, *context, request->job_id()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  auto plan = registry_->GetPlan(request->job_id());
  if (plan.ok()) *response = *std::move(plan);
  reactor->Finish(ToGrpc(plan.status()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s =
          auth::Authorize(tokens_, *context, request->job_id(), "heartbeat as its ranks");
      !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  const absl::Time start = absl::Now();
  auto result = registry_->Heartbeat(*request);
  metrics::Metrics().heartbeat_seconds.WithLabels({})->Observe(absl::Now() - start);
  // Counted by job only once the registry took it: an unknown job id adds no series.
  if (result.ok()) metrics::Metrics().heartbeats.WithLabels({request->job_id()})->Increment();
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpc(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::NodeHeartbeat(grpc::CallbackServerContext* context,
                                                            const v1::NodeHeartbeatRequest* request,
                                                            v1::NodeHeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::AuthorizeClusterMember(tokens_, *context); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  for (const v1::NodeHeartbeatEntry& entry : request->entries()) {
    const v1::HeartbeatRequest& heartbeat = entry.heartbeat();
    v1::NodeHeartbeatResult* result = response->add_results();
    absl::Status s = tokens_ == nullptr
                         ? absl::OkStatus()
                         : tokens_->Check(heartbeat.job_id(), auth::Credentials{entry.job_token()},
                                          "heartbeat as its ranks");
    if (s.ok()) {
      const absl::Time start = absl::Now();
      auto answer = registry_->Heartbeat(heartbeat);
      metrics::Metrics().heartbeat_seconds.WithLabels({})->Observe(absl::Now() - start);
      if (answer.ok()) {
        metrics::Metrics().heartbeats.WithLabels({heartbeat.job_id()})->Increment();
        *result->mutable_response() = *std::move(answer);
      }
      s = answer.status();
    }
    result->set_code(static_cast<int32_t>(s.code()));
    result->set_message(std::string(s.message()));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::Watch(
    grpc::CallbackServerContext* context, const v1::WatchRequest* request) {
  return new WatchStream(registry_, request->job_id(),
                         auth::AuthorizeView(tokens_, *context, request->job_id()));
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* context,
                                                    const v1::LeaveRequest* request,
                                                    v1::LeaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = auth::Authorize(tokens_, *context, request->job_id(), "make a rank leave");
      !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  registry_->Leave(request->job_id(), request->rank(),
                   [reactor, response](absl::StatusOr<int64_t> generation) {
                     if (generation.ok()) response->set_generation(*generation);
                     reactor->Finish(ToGrpc(generation.status()));
                   });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::EndJob(grpc::CallbackServerContext* context,
                                                     const v1::EndJobRequest* request,
                                                     v1::EndJobResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string job_id = request->job_id();
  if (absl::Status s = auth::Authorize(tokens_, *context, job_id, "end it"); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  registry_->EndJob(job_id, [reactor](absl::Status status) { reactor->Finish(ToGrpc(status)); });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RecordCheckpoint(
    grpc::CallbackServerContext* context, const v1::RecordCheckpointRequest* request,
    v1::RecordCheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s =
          auth::Authorize(tokens_, *context, request->job_id(), "record its checkpoints");
      !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  checkpoints_->Record(request->job_id(), request->record(),
                       [reactor, response](absl::StatusOr<v1::CheckpointRecord> record) {
                         if (record.ok()) *response->mutable_record() = *std::move(record);
                         reactor->Finish(ToGrpc(record.status()));
                       });
  return reactor;
}

}  // namespace zerod::server
