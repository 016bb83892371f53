#ifndef ZEROD_SERVER_CLUSTER_HEARTBEAT_RELAY_H_
#define ZEROD_SERVER_CLUSTER_HEARTBEAT_RELAY_H_

// HeartbeatRelay: a follower zerod answers its node's ranks' heartbeats itself, and tells the
// leader about all of them in one Coordinator.NodeHeartbeat call per interval. A rank's heartbeat
// never leaves its node; what crosses the network grows with nodes, not ranks (issue 13: 100,000
// ranks heartbeating one daemon twice a second is what one process cannot hold).
//
// A heartbeat is kept for the next flush. A rank (with that token) the leader accepted last time
// is answered at once with the leader's freshest answer to its job (from one of the last two
// flushes); a refusal is answered as it was; otherwise (a rank's first heartbeat, a token not seen
// before, a job not heard of for two intervals, or after the leader was unreachable) the call
// waits for the next flush's answer. So a rank learns
// of a new generation, a lost rank or its own loss at most one interval later than from the
// leader itself, and a leader that cannot be reached is an UNAVAILABLE naming it within two.
// A rank that stops heartbeating is simply not in the next flush: the leader's lease runs out for
// it as it would have directly, and so it does for every rank of a node whose zerod died.
//
// Owns the flusher thread; the destructor answers calls still waiting with UNAVAILABLE.

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "zerod/v1/coordinator.grpc.pb.h"

namespace zerod::server::cluster {

class HeartbeatRelay {
 public:
  // `leader`: a channel that presents this member's certificate (the leader takes NodeHeartbeat
  // from its cluster's members only, server/auth/cluster_members.h).
  HeartbeatRelay(std::shared_ptr<grpc::Channel> leader, std::string leader_name, std::string node,
                 absl::Duration interval);
  ~HeartbeatRelay();
  HeartbeatRelay(const HeartbeatRelay&) = delete;
  HeartbeatRelay& operator=(const HeartbeatRelay&) = delete;

  // A rank's heartbeat with its job's token; `done` runs once, now or after the next flush,
  // on the caller's thread or the flusher's.
  using Done = std::function<void(const grpc::Status&, const v1::HeartbeatResponse&)>;
  void Take(const v1::HeartbeatRequest& request, std::string job_token, Done done);

  // A Coordinator service a follower registers beside its forwarding, one per server: Heartbeat
  // is answered here, every other method stays generic (forwarded to the leader). The server
  // goes before its service, and the service before this relay.
  std::unique_ptr<grpc::Service> NewService();

  int64_t flushes() const;
  // NodeHeartbeat calls made to the leader (flushes that had heartbeats to send).
  int64_t calls() const;

 private:
  // A rank's heartbeats as one caller sends them: with the token it presents, so that a caller
  // with another token (or none) is judged by the leader on its own, never answered or replaced
  // by another's.
  struct Key {
    std::string job_id;
    int64_t rank = 0;
    std::string job_token;
    bool operator<(const Key& o) const {
      return std::tie(job_id, rank, job_token) < std::tie(o.job_id, o.rank, o.job_token);
    }
  };
  struct Waiting {
    v1::HeartbeatRequest request;
    std::vector<Done> done;  // calls that wait for this flush's answer
  };
  struct Answer {
    grpc::Status status;
    v1::HeartbeatResponse response;
    absl::Time at;
  };
  class Service;

  void FlushLoop();
  void Flush();
  // One NodeHeartbeat of at most kEntriesPerCall heartbeats, and the answers to their callers.
  void SendChunk(const std::vector<std::pair<const Key*, Waiting*>>& chunk);

  const std::string leader_name_;
  const std::string node_;
  const absl::Duration interval_;
  const std::unique_ptr<v1::Coordinator::Stub> stub_;

  mutable Mutex mu_;
  std::map<Key, Waiting> next_ ABSL_GUARDED_BY(mu_);  // since the last flush
  // The leader's last answer to each key, and its last answer to any rank of each job: the
  // generation, state and lost ranks are the job's, so a rank the leader last accepted is answered
  // with the job's freshest answer.
  std::map<Key, Answer> answers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Answer> job_answers_ ABSL_GUARDED_BY(mu_);
  int64_t flushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;
};

}  // namespace zerod::server::cluster

#endif  // ZEROD_SERVER_CLUSTER_HEARTBEAT_RELAY_H_
