#ifndef ZEROD_SERVER_DAEMON_H_
#define ZEROD_SERVER_DAEMON_H_

// Daemon: the zerod process's parts wired together: state store, registry, gRPC server with the
// Coordinator, Store and Inspect services plus health and reflection, and the lease reaper.
//
// Owns the reaper thread (stopped by Shutdown) and gRPC's threads.

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "runtime/common/mutex.h"
#include "server/auth/transport_security.h"
#include "server/instance_lock.h"
#include "server/job_registry.h"
#include "server/job_store.h"
#include "server/state/sqlite_kv_store.h"

namespace grpc {
class Server;
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
  // Who may connect to the Unix socket at all: its mode, and its group (empty: the daemon's).
  int socket_mode = 0660;
  std::string socket_group;
  auth::TlsFiles tls;                // for the TCP listener
  bool allow_plaintext_tcp = false;  // a non-loopback listener without TLS
};

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  // The TCP port bound (when listening on TCP).
  int tcp_port() const { return tcp_port_; }
  // Answers waiting calls with UNAVAILABLE, drains in-flight calls (up to `grace`), stops.
  void Shutdown(absl::Duration grace);

 private:
  Daemon() = default;
  void ReaperLoop();

  DaemonOptions options_;
  // Destroyed last: the claims outlive everything that uses the data dir and the socket.
  std::optional<InstanceLock> data_lock_;
  std::optional<InstanceLock> socket_lock_;
  std::unique_ptr<RealClock> clock_;
  // Before kv_, so destroyed after it: the commits kv_ drains call back into it.
  std::unique_ptr<CheckpointRecords> checkpoints_;
  std::unique_ptr<SqliteKvStore> kv_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<auth::JobTokens> tokens_;
  std::unique_ptr<CoordinatorService> coordinator_;
  std::unique_ptr<StoreService> store_;
  std::unique_ptr<InspectService> inspect_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;

  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_DAEMON_H_
