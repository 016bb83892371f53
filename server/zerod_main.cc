// zerod: the coordinator daemon. See README.md ("Running zerod").

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/common/units.h"
#include "server/auth/transport_security.h"
#include "server/daemon.h"
#include "server/logging.h"

namespace {

int UsageError(const std::string& message) {
  std::cerr << "zerod: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zerod::server;
  // gRPC locks with absl::Mutex; Debian's abseil checks every lock for cycles, which costs more
  // than the daemon's own work per call. Lock ordering is checked by the TSan build instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  DaemonOptions options;
  options.socket_path = "/run/zerod/zerod.sock";
  options.listen_address = "127.0.0.1:7420";
  std::string lease_ttl = "10s", restart_grace = "10s", sync = "full", log_level = "info";
  std::string max_message = "64MiB", port_file, socket_mode = "0660";
  bool no_auth = false;
  CLI::App app{"zerod: the ZeRO coordinator daemon"};
  app.add_option("--socket", options.socket_path, "Unix socket path (empty: none)")
      ->capture_default_str();
  app.add_option("--listen", options.listen_address,
                 "TCP HOST:PORT (port 0 picks one; empty: none)")
      ->capture_default_str();
  app.add_option("--data-dir", options.data_dir, "State directory (SQLite file zerod.db)")
      ->capture_default_str();
  app.add_option("--lease-ttl", lease_ttl, "A rank without heartbeat this long is lost")
      ->capture_default_str();
  app.add_option("--restart-grace", restart_grace, "Extra lease time after a restart")
      ->capture_default_str();
  app.add_option("--sync", sync, "full (fsync every commit) or normal (survives crashes only)")
      ->capture_default_str();
  app.add_option("--max-message", max_message, "Largest gRPC message accepted")
      ->capture_default_str();
  app.add_option("--port-file", port_file, "Write the bound TCP port here");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  // Limits: what one request or one job may take (README "Limits").
  std::string max_value = "4MiB", max_store_bytes = "256MiB";
  app.add_option("--max-world-size", options.join_limits.max_world_size,
                 "Most ranks a job may declare (up to 16777216)")
      ->capture_default_str();
  app.add_option("--max-jobs", options.max_jobs, "Most jobs open at once (ended ones do not count)")
      ->capture_default_str();
  app.add_option("--max-job-id-bytes", options.join_limits.max_job_id_bytes,
                 "Longest job id (up to 1024)")
      ->capture_default_str();
  app.add_option("--max-key-bytes", options.store_limits.max_key_bytes,
                 "Longest store key (up to 65536)")
      ->capture_default_str();
  app.add_option("--max-value", max_value, "Largest store value")->capture_default_str();
  app.add_option("--max-store-keys", options.store_limits.max_keys_per_job,
                 "Most keys one job's store may hold")
      ->capture_default_str();
  app.add_option("--max-store-bytes", max_store_bytes,
                 "Most bytes (keys and values) one job's store may hold")
      ->capture_default_str();
  app.add_flag("--reset-state", options.reset_state,
               "Move the state files aside (DATA_DIR/zerod.db.reset-<time>, never deleted) and "
               "start empty: the way past a damaged, emptied or missing state; use once");
  // Authentication and transport security (README "Security").
  app.add_option("--socket-mode", socket_mode, "Mode of the Unix socket (who may connect)")
      ->capture_default_str();
  app.add_option("--socket-group", options.socket_group,
                 "Group of the Unix socket (default: the daemon's)");
  app.add_option("--admin-token-file", options.admin_token_file,
                 "Admin token, made 0600 at first start (default DATA_DIR/admin.token)");
  app.add_option("--tls-cert", options.tls.cert, "PEM certificate of the TCP listener");
  app.add_option("--tls-key", options.tls.key, "PEM private key of the TCP listener");
  app.add_option("--tls-client-ca", options.tls.client_ca,
                 "Require TCP clients to present a certificate signed by this CA");
  app.add_flag("--allow-plaintext-tcp", options.allow_plaintext_tcp,
               "Listen on a non-loopback address without TLS (a trusted network only)");
  app.add_flag("--no-auth", no_auth,
               "No job tokens: any client may act on any job (benchmarks, trusted rigs)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    for (char& c : what) c = c == '\n' ? ' ' : c;
    return UsageError(what);
  }
  if (!SetLogLevel(log_level)) return UsageError("--log-level: unknown level '" + log_level + "'");
  // A day at most: a lease that never runs out ("inf") would never release anyone.
  const absl::Duration longest = absl::Hours(24);
  if (!absl::ParseDuration(lease_ttl, &options.lease_ttl) ||
      options.lease_ttl <= absl::ZeroDuration() || options.lease_ttl > longest) {
    return UsageError(
        "--lease-ttl: expected a positive duration up to 24h like 10s or 500ms, got '" +
        lease_ttl.substr(0, 64) + "'");
  }
  if (!absl::ParseDuration(restart_grace, &options.restart_grace) ||
      options.restart_grace < absl::ZeroDuration() || options.restart_grace > longest) {
    return UsageError("--restart-grace: expected a duration up to 24h like 10s, got '" +
                      restart_grace.substr(0, 64) + "'");
  }
  if (sync == "full") {
    options.durability = Durability::kFull;
  } else if (sync == "normal") {
    options.durability = Durability::kNormal;
  } else {
    return UsageError("--sync: expected full or normal, got '" + sync + "'");
  }
  auto max_bytes = zerod::ParseBytes(max_message);
  if (!max_bytes.ok() || *max_bytes > (int64_t{1} << 30)) {
    return UsageError("--max-message: expected a size up to 1GiB, got '" + max_message + "'");
  }
  options.max_message_bytes = *max_bytes;
  {
    // Each limit in its range, or a usage error naming the flag.
    struct Bounded {
      const char* flag;
      int64_t value, min, max;
    };
    for (const Bounded& b : {
             Bounded{"--max-world-size", options.join_limits.max_world_size, 1,
                     zerod::server::kHardMaxWorldSize},
             Bounded{"--max-jobs", options.max_jobs, 1, int64_t{1} << 30},
             Bounded{"--max-job-id-bytes", options.join_limits.max_job_id_bytes, 1, 1024},
             Bounded{"--max-key-bytes", options.store_limits.max_key_bytes, 1, 65536},
             Bounded{"--max-store-keys", options.store_limits.max_keys_per_job, 1,
                     int64_t{1} << 40},
         }) {
      if (b.value < b.min || b.value > b.max) {
        return UsageError(std::string(b.flag) + ": expected " + std::to_string(b.min) + ".." +
                          std::to_string(b.max) + ", got " + std::to_string(b.value));
      }
    }
    auto value_bytes = zerod::ParseBytes(max_value);
    if (!value_bytes.ok() || *value_bytes < 1) {
      return UsageError("--max-value: expected a size like 4MiB, got '" + max_value + "'");
    }
    options.max_value_bytes = *value_bytes;
    auto store_bytes = zerod::ParseBytes(max_store_bytes);
    if (!store_bytes.ok() || *store_bytes < 1) {
      return UsageError("--max-store-bytes: expected a size like 256MiB, got '" + max_store_bytes +
                        "'");
    }
    options.store_limits.max_bytes_per_job = *store_bytes;
  }
  options.authenticate = !no_auth;
  {
    size_t used = 0;
    int mode = -1;
    try {
      mode = std::stoi(socket_mode, &used, 8);
    } catch (const std::exception&) {
    }
    if (used != socket_mode.size() || mode < 0 || mode > 0777) {
      return UsageError("--socket-mode: expected an octal mode like 0660, got '" + socket_mode +
                        "'");
    }
    options.socket_mode = mode;
  }
  if (absl::Status s = zerod::server::auth::CheckTcpSecurity(options.listen_address, options.tls,
                                                             options.allow_plaintext_tcp);
      !s.ok()) {
    return UsageError(std::string(s.message()));
  }

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto daemon = Daemon::Start(options);
  // A flag whose value is wrong (an unknown --socket-group, an unreadable --tls-cert) is named by
  // the message: a usage error.
  if (!daemon.ok() && daemon.status().code() == absl::StatusCode::kInvalidArgument &&
      absl::StartsWith(daemon.status().message(), "--")) {
    return UsageError(std::string(daemon.status().message()));
  }
  if (!daemon.ok()) {
    Logger("coordinator")->error("{}", std::string(daemon.status().message()));
    return 1;
  }
  if (!port_file.empty()) {
    std::ofstream(port_file) << (*daemon)->tcp_port() << "\n";
  }
  int signal = 0;
  sigwait(&signals, &signal);
  Logger("coordinator")->info("signal {} received", signal);
  (*daemon)->Shutdown(absl::Seconds(5));
  daemon->reset();
  Logger("coordinator")->info("stopped");
  return 0;
}
