#ifndef ZEROD_SERVER_DAEMON_H_
#define ZEROD_SERVER_DAEMON_H_

// Daemon: the zerod process's parts wired together: state store, registry, gRPC server with the
// Coordinator, Store and Inspect services plus health and reflection, and the lease reaper.
//
// Owns the reaper thread (stopped by Shutdown) and gRPC's threads.

#include <grpcpp/generic/generic_stub.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "runtime/common/mutex.h"
#include "server/auth/transport_security.h"
#include "server/http/http_server.h"
#include "server/instance_lock.h"
#include "server/job_registry.h"
#include "server/job_store.h"
#include "server/state/etcd_claim.h"
#include "server/state/etcd_security.h"
#include "server/state/kv_store.h"
#include "server/state/sqlite_kv_store.h"

namespace grpc {
class Server;
}

namespace zerod::metrics {
class JobMetrics;
}

namespace zerod::status {
class HistorySampler;
}

namespace zerod::server {

class JobRegistry;
class CheckpointRecords;
class CoordinatorService;
class StoreService;
class InspectService;
class RealClock;
namespace auth {
class JobTokens;
}

struct DaemonOptions {
  std::string socket_path;     // empty: no Unix socket
  std::string listen_address;  // empty: no TCP; port 0 picks a free port
  std::string data_dir = "/var/lib/zerod";
  // Where the state lives (--store): "sqlite" (DATA_DIR/zerod.db) or "etcd://host:port,.../prefix".
  std::string store = "sqlite";
  // etcd's --max-txn-ops (--etcd-max-txn-ops), so that the etcd store groups up to that many ops
  // in one transaction.
  int64_t etcd_max_txn_ops = 128;
  // Whether Start takes the data dir's and the socket's locks; false when the caller holds them
  // for longer than this daemon (a cluster member, which changes roles on the same paths).
  bool claim_paths = true;
  // How zerod speaks to etcd (--etcd-ca, --etcd-cert, --etcd-key, read once at start by
  // LoadEtcdTls), and whether it may run on an etcd that is not zerod's own
  // (--allow-insecure-etcd; server/state/etcd_security.h).
  EtcdTls etcd_tls;
  bool allow_insecure_etcd = false;
  // The host other nodes reach this node's ranks at (--node-address; else --advertise's host, or
  // in a cluster the --listen host): ranks that join through the socket are told it, and their
  // Gloo listens there. Empty: not told (they listen on ZEROD_GLOO_HOST, default 127.0.0.1).
  std::string node_address;
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration restart_grace = absl::Seconds(10);
  Durability durability = Durability::kFull;
  int64_t max_message_bytes = 64 << 20;
  int64_t max_value_bytes = 4 << 20;
  // What one request or one job may take (README "Limits"): --max-world-size, --max-job-id-bytes,
  // --max-jobs, --max-key-bytes, --max-store-keys, --max-store-bytes.
  JoinLimits join_limits;
  int64_t max_jobs = RegistryOptions{}.max_jobs;
  StoreLimits store_limits;  // its max_value_bytes is max_value_bytes above
  // Move a damaged (or any) state aside to DATA_DIR/zerod.db.reset-<time> and start empty.
  bool reset_state = false;
  // Authentication (docs/ARCHITECTURE.md, "Authentication and authorization"). Off: every caller
  // may act on every job, as before it existed (for benchmarks and trusted test rigs only).
  bool authenticate = true;
  std::string admin_token_file;  // empty: DATA_DIR/admin.token
  // Read-only views over TCP need the viewer token (or the admin's, or the job's own), made in
  // `viewer_token_file` (empty: DATA_DIR/viewer.token) readable by `viewer_group` (empty: nobody
  // else), unless `open_inspection`. Over the Unix socket its mode and group decide. The HTTP
  // listener needs the viewer or admin token for everything, unless `open_inspection`.
  std::string viewer_token_file;
  std::string viewer_group;
  bool open_inspection = false;
  // Who may connect to the Unix socket at all: its mode, and its group (empty: the daemon's).
  int socket_mode = 0660;
  std::string socket_group;
  // The TCP listener's TLS (read once at start by auth::LoadTls); its cluster_ca names who is a
  // cluster member.
  auth::TlsPem tls;
  bool allow_plaintext_tcp = false;  // a non-loopback listener without TLS
  // The HTTP listener (/metrics, the status page): --http-listen, empty = none. Port 0 picks one.
  std::string http_listen;
  // Per-rank metric series only for jobs of at most this many ranks (--metrics-max-ranks-per-job).
  int64_t metrics_max_ranks_per_job = 64;
  // A FAKE FOR TESTS ONLY (ZEROD_TEST_STALL_LOOP_AFTER): this long after the start, a callback
  // that never returns until the drain blocks the registry's timer thread, as a deadlock would;
  // the watchdog test checks that the pings then stop.
  absl::Duration test_stall_loop_after = absl::InfiniteDuration();
};

class Daemon {
 public:
  // `claim`: with --store etcd, the etcd claim on the state, which the caller (a cluster member
  // elected leader, server/cluster/member.h) holds; the daemon releases it after its state closed.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options,
                                                       std::unique_ptr<EtcdClaim> claim = nullptr);
  ~Daemon();

  // The TCP port bound (when listening on TCP).
  int tcp_port() const { return tcp_port_; }
  // The HTTP port bound (when --http-listen is given), else 0.
  int http_port() const { return http_ ? http_->port() : 0; }
  // Drains, in this order: health turns NOT_SERVING (probes and balancers stop sending), waiting
  // joins, watches (connected ranks) and store waits are answered UNAVAILABLE "shutting down;
  // retry", no new call is accepted and in-flight ones finish (up to `grace`, then cancelled), and
  // the state store commits what is queued and closes.
  void Shutdown(absl::Duration grace);

  // OK when the daemon's loops ran a probe within `timeout`: a health check answered through the
  // gRPC server (its threads and completion queues), a callback run on the registry's timer
  // thread, and a lease sweep not overdue. The service watchdog pings only after OK.
  absl::Status ProbeLoops(absl::Duration timeout);
  // One line for the service manager's STATUS=: jobs open, and where the daemon listens.
  std::string StatusLine() const;
  // The etcd claim on the state (--store etcd), else null: a cluster leader rewrites its value
  // once its TCP port is bound.
  EtcdClaim* claim() const { return claim_.get(); }

 private:
  Daemon() = default;
  void ReaperLoop();
  // The HTTP listener on options_.http_listen, with /metrics.
  absl::Status StartHttp();
  // Job tokens, the admin and viewer tokens, and who is a cluster member (options_.authenticate).
  absl::Status StartAuth(gid_t viewer_gid);

  DaemonOptions options_;
  // Destroyed last: the claims outlive everything that uses the data dir and the socket.
  std::optional<InstanceLock> data_lock_;
  std::optional<InstanceLock> socket_lock_;
  std::unique_ptr<RealClock> clock_;
  // Before kv_, so destroyed after it: the commits kv_ drains call back into it.
  std::unique_ptr<CheckpointRecords> checkpoints_;
  // etcd's claim on the state (--store etcd://...): released after kv_ has closed.
  std::unique_ptr<EtcdClaim> claim_;
  std::unique_ptr<KvStore> kv_;
  std::string state_where_;  // the state's place, for messages
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<auth::JobTokens> tokens_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<StoreService> store_;
  std::unique_ptr<InspectService> inspect_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;
  // The HTTP listener and what /metrics reads; stopped before the registry goes.
  std::unique_ptr<metrics::JobMetrics> job_metrics_;
  // The status page's step-rate history (server/status); its thread stops with the listener.
  std::unique_ptr<status::HistorySampler> history_sampler_;
  std::unique_ptr<http::HttpServer> http_;

  // The watchdog's probes: gRPC's own health service through an in-process channel, and the timer
  // probe still waiting to run (no second one is posted behind a stuck one).
  std::unique_ptr<grpc::GenericStub> probe_stub_;
  std::shared_ptr<absl::Notification> timer_probe_;
  // Releases the test-only stall (DaemonOptions::test_stall_loop_after) at shutdown.
  std::shared_ptr<absl::Notification> release_stall_ = std::make_shared<absl::Notification>();

  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_DAEMON_H_
