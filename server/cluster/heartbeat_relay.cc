#include "server/cluster/heartbeat_relay.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/auth/call_auth.h"

namespace zerod::server::cluster {
namespace {

// Every Coordinator method but Heartbeat and NodeHeartbeat stays generic: the forwarding server
// relays it. NodeHeartbeat is refused here: only members may call it, and a follower adds the
// cluster's secret to every call it relays.
using RelayedCoordinator =
    v1::Coordinator::WithGenericMethod_Join<v1::Coordinator::WithGenericMethod_GetPlan<
        v1::Coordinator::WithCallbackMethod_Heartbeat<v1::Coordinator::WithGenericMethod_Watch<
            v1::Coordinator::WithGenericMethod_Leave<v1::Coordinator::WithGenericMethod_EndJob<
                v1::Coordinator::WithGenericMethod_RecordCheckpoint<
                    v1::Coordinator::WithCallbackMethod_NodeHeartbeat<
                        v1::Coordinator::Service>>>>>>>>;

// Heartbeats one NodeHeartbeat carries at most: a flush of many ranks goes in several calls, so
// no answer nears a message limit and one bad batch cannot fail every rank of the node.
constexpr int kEntriesPerCall = 1024;
// Distinct (job, rank, token) heartbeats one flush holds at most; more are refused
// (RESOURCE_EXHAUSTED) rather than grown without bound by a flood of made-up ones.
constexpr size_t kMaxPending = 65536;

}  // namespace

class HeartbeatRelay::Service final : public RelayedCoordinator {
 public:
  explicit Service(HeartbeatRelay* relay) : relay_(relay) {}

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // The call stays open until `done`: its request and response live until Finish.
    relay_->Take(
        *request, auth::CredentialsOf(*context).job_token,
        [reactor, response](const grpc::Status& status, const v1::HeartbeatResponse& answer) {
          if (status.ok()) *response = answer;
          reactor->Finish(status);
        });
    return reactor;
  }

  grpc::ServerUnaryReactor* NodeHeartbeat(grpc::CallbackServerContext* context,
                                          const v1::NodeHeartbeatRequest*,
                                          v1::NodeHeartbeatResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "NodeHeartbeat is for the cluster's members: a follower zerod "
                                 "relays no one else's"));
    return reactor;
  }

 private:
  HeartbeatRelay* const relay_;
};

HeartbeatRelay::HeartbeatRelay(std::shared_ptr<grpc::Channel> leader, std::string leader_name,
                               std::string node, absl::Duration interval)
    : leader_name_(std::move(leader_name)),
      node_(std::move(node)),
      interval_(interval),
      stub_(v1::Coordinator::NewStub(std::move(leader))) {
  flusher_ = std::thread([this] { FlushLoop(); });
}

HeartbeatRelay::~HeartbeatRelay() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  flusher_.join();
  std::map<Key, Waiting> left;
  {
    MutexLock lock(&mu_);
    left.swap(next_);
  }
  const grpc::Status stopped(grpc::StatusCode::UNAVAILABLE,
                             "zerod is changing roles or stopping; retry");
  for (auto& [key, waiting] : left) {
    for (Done& done : waiting.done) done(stopped, v1::HeartbeatResponse());
  }
}

std::unique_ptr<grpc::Service> HeartbeatRelay::NewService() {
  return std::make_unique<Service>(this);
}

int64_t HeartbeatRelay::flushes() const {
  MutexLock lock(&mu_);
  return flushes_;
}

int64_t HeartbeatRelay::calls() const {
  MutexLock lock(&mu_);
  return calls_;
}

void HeartbeatRelay::Take(const v1::HeartbeatRequest& request, std::string job_token, Done done) {
  const Key key{request.job_id(), request.rank(), std::move(job_token)};
  std::optional<Answer> fresh;
  bool stopping = false;
  bool full = false;
  {
    MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping && next_.size() >= kMaxPending && next_.find(key) == next_.end()) {
      full = true;
    } else if (!stopping) {
      Waiting& waiting = next_[key];
      waiting.request = request;
      const absl::Time oldest = absl::Now() - 2 * interval_;
      auto own = answers_.find(key);
      auto job = job_answers_.find(request.job_id());
      if (own != answers_.end() && own->second.at >= oldest && !own->second.status.ok()) {
        fresh = own->second;
      } else if (own != answers_.end() && own->second.status.ok() && job != job_answers_.end() &&
                 job->second.at >= oldest) {
        fresh = job->second;
      } else {
        waiting.done.push_back(std::move(done));
      }
    }
  }
  if (stopping) {
    done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "zerod is stopping; retry"),
         v1::HeartbeatResponse());
  } else if (full) {
    done(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("this node's zerod holds ", kMaxPending,
                                   " heartbeats of distinct ranks already; retry")),
         v1::HeartbeatResponse());
  } else if (fresh) {
    done(fresh->status, fresh->response);
  }
}

void HeartbeatRelay::FlushLoop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; },
                               interval_)) {
        return;
      }
    }
    Flush();
  }
}

void HeartbeatRelay::Flush() {
  std::map<Key, Waiting> batch;
  {
    MutexLock lock(&mu_);
    batch.swap(next_);
    ++flushes_;
  }
  std::vector<std::pair<const Key*, Waiting*>> chunk;
  for (auto& [key, waiting] : batch) {
    chunk.emplace_back(&key, &waiting);
    if (chunk.size() == kEntriesPerCall) {
      SendChunk(chunk);
      chunk.clear();
    }
  }
  if (!chunk.empty()) SendChunk(chunk);
}

void HeartbeatRelay::SendChunk(const std::vector<std::pair<const Key*, Waiting*>>& chunk) {
  {
    MutexLock lock(&mu_);
    ++calls_;
  }
  v1::NodeHeartbeatRequest request;
  request.set_node(node_);
  for (const auto& [key, waiting] : chunk) {
    v1::NodeHeartbeatEntry* entry = request.add_entries();
    entry->set_job_token(key->job_token);
    *entry->mutable_heartbeat() = waiting->request;
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + std::max(4 * interval_, absl::Seconds(2))));
  v1::NodeHeartbeatResponse response;
  grpc::Status status = stub_->NodeHeartbeat(&context, request, &response);
  if (status.ok() && response.results_size() != request.entries_size()) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, "answers do not match the heartbeats sent");
  }
  // A refusal of the whole call (not a member) is passed on as it is: retrying cannot help.
  const grpc::StatusCode failed_as =
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
              status.error_code() == grpc::StatusCode::UNAUTHENTICATED
          ? status.error_code()
          : grpc::StatusCode::UNAVAILABLE;
  const absl::Time now = absl::Now();
  std::vector<std::pair<Done, Answer>> to_answer;
  {
    MutexLock lock(&mu_);
    int i = 0;
    for (const auto& [key, waiting] : chunk) {
      Answer answer{grpc::Status::OK, v1::HeartbeatResponse(), now};
      if (!status.ok()) {
        // Not cached: the next heartbeat waits for a flush that reaches the leader.
        answer.status = grpc::Status(
            failed_as, absl::StrCat("zerod leader ", leader_name_,
                                    ": relaying heartbeats: ", status.error_message()));
        answers_.erase(*key);
        job_answers_.erase(key->job_id);
      } else {
        const v1::NodeHeartbeatResult& result = response.results(i);
        answer.status =
            grpc::Status(static_cast<grpc::StatusCode>(result.code()), result.message());
        answer.response = result.response();
        answers_[*key] = answer;
        if (answer.status.ok()) job_answers_[key->job_id] = answer;
      }
      for (Done& done : waiting->done) to_answer.emplace_back(std::move(done), answer);
      ++i;
    }
    // Ranks that stopped heartbeating long ago.
    for (auto it = answers_.begin(); it != answers_.end();) {
      it = now - it->second.at > 20 * interval_ ? answers_.erase(it) : std::next(it);
    }
    for (auto it = job_answers_.begin(); it != job_answers_.end();) {
      it = now - it->second.at > 20 * interval_ ? job_answers_.erase(it) : std::next(it);
    }
  }
  for (auto& [done, answer] : to_answer) done(answer.status, answer.response);
}

}  // namespace zerod::server::cluster
