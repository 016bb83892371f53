#ifndef ZEROD_SERVER_CLUSTER_MEMBER_H_
#define ZEROD_SERVER_CLUSTER_MEMBER_H_

// Member: what one zerod process runs.
//
// With SQLite (the embedded default) it is one Daemon for the process's life, as before.
//
// With --store etcd://..., the zerods given the same etcd and prefix form a cluster, one per
// node, and each is either:
//   - the leader: it holds the etcd claim on the state (etcd_claim.h) and runs the Daemon over it
//     (registry, plans, stores, checkpoints); one decider, so a generation gets one plan; or
//   - a follower: a ForwardingServer on its node's socket and TCP port that relays every call to
//     the leader over mutual TLS, with its member certificate (server/auth/cluster_members.h),
//     saying how the caller came in (proto/auth_metadata.h), and a ClaimWatch on the leader's
//     claim.
//
// Before either, a member checks that etcd is the cluster's own: that it lets this zerod at its
// keys and keeps it to them, which it does only with its authentication on
// (server/state/etcd_security.h), unless --allow-insecure-etcd.
// When the leader's claim changes (its daemon stopped, died and its lease ran out, or lost etcd),
// the watch, or the leader's own claim, asks for a new election (`role_changed`, which the main
// thread answers with Reelect). The first to take the claim loads the whole state from etcd and
// leads; the others follow it. Ranks reach their node's zerod only, through either role; while a
// role changes their calls fail UNAVAILABLE and the SDK retries.
//
// The paths (data dir, socket) are locked by the member for its whole life, across roles.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/cluster/forwarding_server.h"
#include "server/cluster/heartbeat_relay.h"
#include "server/daemon.h"
#include "server/instance_lock.h"
#include "server/state/etcd_claim.h"
#include "server/state/etcd_kv_store.h"

namespace zerod::server::cluster {

struct ClusterOptions {
  std::string node;  // this node's name in the claim and in messages (default: host name)
  // HOST:PORT followers forward to (default: the bound --listen address); its host is also the
  // default of DaemonOptions::node_address.
  std::string advertise;
};

class Member {
 public:
  // `role_changed` runs on another thread when an election is due; the caller then calls Reelect
  // from its own thread (never from the callback).
  static absl::StatusOr<std::unique_ptr<Member>> Start(const DaemonOptions& options,
                                                       const ClusterOptions& cluster,
                                                       std::function<void()> role_changed);
  ~Member();
  Member(const Member&) = delete;
  Member& operator=(const Member&) = delete;

  // Stops the current role and takes the next one, if an election was asked for since the last
  // (else nothing). CANCELLED when asked to stop meanwhile; another error is fatal (exit 1).
  absl::Status Reelect();
  // Stops the current role (a leader drains, as on SIGTERM).
  void Shutdown(absl::Duration grace);

  // The daemon's probes (leader), or OK while forwarding (follower).
  absl::Status ProbeLoops(absl::Duration timeout);
  std::string StatusLine() const;
  int tcp_port() const;
  int http_port() const;
  // Whether this member leads (always, with SQLite).
  bool leading() const;

 private:
  Member(DaemonOptions options, ClusterOptions cluster, std::function<void()> role_changed);
  // Takes the claim and leads, or follows whoever holds it; waits as long as etcd does not answer
  // or the holder has not announced its endpoint. CANCELLED when SIGTERM or SIGINT is pending.
  absl::Status Elect();
  absl::Status ElectUntilDone();
  absl::Status Lead(std::unique_ptr<EtcdClaim> claim);
  // Follows the holder of the claim (its value as read, its endpoint and node name in it).
  absl::Status Follow(const std::string& holder, const std::string& endpoint,
                      const std::string& node);
  std::string HolderValue(const std::string& endpoint) const;
  // Stops whichever role runs (outside mu_).
  void StopRole(absl::Duration grace);
  void AskForElection();

  const DaemonOptions options_;
  const ClusterOptions cluster_;
  const std::function<void()> role_changed_;
  std::optional<EtcdOptions> etcd_;  // with --store etcd
  std::optional<InstanceLock> data_lock_;
  std::optional<InstanceLock> socket_lock_;
  std::atomic<bool> election_due_{false};

  mutable Mutex mu_;
  std::shared_ptr<Daemon> daemon_ ABSL_GUARDED_BY(mu_);
  // A follower's two servers: its TCP port's, and its socket's (the leader is told which).
  std::shared_ptr<ForwardingServer> forwarder_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ForwardingServer> socket_forwarder_ ABSL_GUARDED_BY(mu_);
  // A follower's heartbeats: answered on the node, sent to the leader together; its services
  // (one per forwarding server) outlive the servers, and the relay the services.
  std::shared_ptr<HeartbeatRelay> relay_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<grpc::Service>> relay_services_ ABSL_GUARDED_BY(mu_);
  std::string leader_ ABSL_GUARDED_BY(mu_);  // a follower's leader: "node at host:port"
  bool electing_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<ClaimWatch> watch_;  // main thread only
};

}  // namespace zerod::server::cluster

#endif  // ZEROD_SERVER_CLUSTER_MEMBER_H_
