// zerod: the coordinator daemon. See README.md ("Running zerod").

#include <arpa/inet.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/units.h"
#include "server/auth/transport_security.h"
#include "server/cluster/member.h"
#include "server/daemon.h"
#include "server/http/http_server.h"
#include "server/logging.h"
#include "server/service/drain_bound.h"
#include "server/service/flag_sources.h"
#include "server/service/health_listener.h"
#include "server/service/liveness_watchdog.h"
#include "server/service/systemd_notify.h"
#include "server/state/state_store.h"

namespace {

int UsageError(const std::string& message) {
  std::cerr << "zerod: " << message << "\n";
  return 2;
}

// The PEM files of the TLS flags into `options`; INVALID_ARGUMENT naming the flag at fault.
absl::Status LoadCredentials(const zerod::server::auth::TlsFiles& tls_files,
                             const zerod::server::EtcdTlsFiles& etcd_files,
                             zerod::server::DaemonOptions* options) {
  auto tls = zerod::server::auth::LoadTls(tls_files);
  if (!tls.ok()) return tls.status();
  auto etcd_tls = zerod::server::LoadEtcdTls(etcd_files);
  if (!etcd_tls.ok()) return etcd_tls.status();
  options->tls = *std::move(tls);
  options->etcd_tls = *std::move(etcd_tls);
  return absl::OkStatus();
}

// The port-file flags' paths, checked before anything starts: one that names a link, a device or
// a FIFO is a usage error ("--port-file: ..."; refused again at the rename). Empty: none is.
std::string PortFileProblem(const std::string& port_file, const std::string& http_port_file) {
  for (const auto& [flag, path] :
       {std::pair{"--port-file", &port_file}, std::pair{"--http-port-file", &http_port_file}}) {
    if (path->empty()) continue;
    if (absl::Status s = zerod::CheckRegularFileTarget(*path); !s.ok()) {
      return std::string(flag) + ": " + std::string(s.message());
    }
  }
  return "";
}

// Writes the bound ports into the port files given, each beside its name and renamed over it;
// false (logged) when one cannot be written.
bool WritePortFiles(const std::string& port_file, int tcp_port, const std::string& http_port_file,
                    int http_port) {
  for (const auto& [path, port] :
       {std::pair{&port_file, tcp_port}, std::pair{&http_port_file, http_port}}) {
    if (path->empty()) continue;
    absl::Status s = zerod::WriteFileAtomically(*path, std::to_string(port) + "\n");
    if (!s.ok()) {
      zerod::server::Logger("coordinator")
          ->error("cannot write the port file: {}", std::string(s.message()));
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zerod::server;
  // gRPC locks with absl::Mutex; Debian's abseil checks every lock for cycles, which costs more
  // than the daemon's own work per call. Lock ordering is checked by the TSan build instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  DaemonOptions options;
  // The TLS flags name files; LoadCredentials reads them into options.
  auth::TlsFiles tls_files;
  EtcdTlsFiles etcd_files;
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
  app.add_option("--store", options.store,
                 "Where the state lives: sqlite (DATA_DIR/zerod.db) or "
                 "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (one zerod per prefix)")
      ->capture_default_str();
  app.add_option("--etcd-max-txn-ops", options.etcd_max_txn_ops,
                 "etcd's own --max-txn-ops: zerod groups up to 3/4 of it in ops in one "
                 "transaction (raise both for large jobs: README \"zerod on etcd\")")
      ->capture_default_str();
  // How zerod speaks to etcd (docs/operators.md "zerod on etcd").
  app.add_option("--etcd-ca", etcd_files.ca,
                 "CA of etcd's member certificates: zerod speaks TLS to etcd when given it");
  app.add_option("--etcd-cert", etcd_files.cert,
                 "zerod's client certificate for etcd (its CN is zerod's etcd user, with "
                 "etcd's --client-cert-auth)");
  app.add_option("--etcd-key", etcd_files.key,
                 "Private key of --etcd-cert (zerod's alone: mode 0600 or stricter)");
  app.add_flag("--allow-insecure-etcd", options.allow_insecure_etcd,
               "Run on an etcd that is not zerod's own: its authentication off (whoever reaches "
               "it could read and rewrite the cluster's state), or zerod's user let beyond its "
               "keys (a test rig only)");
  zerod::server::cluster::ClusterOptions cluster_options;
  app.add_option("--node", cluster_options.node,
                 "This node's name in an etcd cluster (default: the host name)");
  app.add_option("--advertise", cluster_options.advertise,
                 "HOST:PORT the other members of an etcd cluster reach this one at (default: the "
                 "bound --listen address, the host name for 0.0.0.0)");
  app.add_option("--node-address", options.node_address,
                 "HOST the ranks of this node are reached at by their peers on other nodes, told "
                 "to the ranks that join through the socket (default: the host of --advertise; "
                 "in an etcd cluster, else of --listen unless it is a wildcard)");
  app.add_option("--lease-ttl", lease_ttl, "A rank without heartbeat this long is lost")
      ->capture_default_str();
  app.add_option("--restart-grace", restart_grace, "Extra lease time after a restart")
      ->capture_default_str();
  app.add_option("--sync", sync, "full (fsync every commit) or normal (survives crashes only)")
      ->capture_default_str();
  app.add_option("--max-message", max_message, "Largest gRPC message accepted")
      ->capture_default_str();
  app.add_option("--port-file", port_file, "Write the bound TCP port here");
  // Metrics (README "Metrics"): off unless given; the shipped unit and manifests use :9464.
  std::string http_port_file;
  app.add_option("--http-listen", options.http_listen,
                 "HTTP HOST:PORT for /metrics and the status page (e.g. 127.0.0.1:9464; port 0 "
                 "picks one; empty: none); they need the viewer or admin token unless "
                 "--open-inspection");
  app.add_option("--http-port-file", http_port_file, "Write the bound HTTP port here");
  app.add_option("--metrics-max-ranks-per-job", options.metrics_max_ranks_per_job,
                 "Per-rank metric series only for jobs of at most this many ranks")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  // Logs and the service side (README "Running zerod as a service").
  std::string log_format = "text", drain_timeout = "10s";
  LogOptions log_options;
  app.add_option("--log-format", log_format, "text, or json: one JSON object per line")
      ->capture_default_str();
  app.add_option("--log-file", log_options.file,
                 "Append logs to this file, reopened on SIGHUP (default: stderr)");
  app.add_option("--drain-timeout", drain_timeout,
                 "On SIGTERM, how long in-flight calls may take before they are cancelled")
      ->capture_default_str();
  std::string health_listen;
  app.add_option(
      "--health-listen", health_listen,
      "Plaintext HOST:PORT serving only grpc.health.v1, SERVING while the daemon's loops "
      "answer (Kubernetes grpc probes; empty: none)");
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
  app.add_option("--viewer-token-file", options.viewer_token_file,
                 "Viewer token for read-only views over TCP, made at first start (default "
                 "DATA_DIR/viewer.token)");
  app.add_option("--viewer-group", options.viewer_group,
                 "Group that may read the viewer token (default: none but the daemon's user)");
  app.add_flag("--open-inspection", options.open_inspection,
               "Read-only views need no token: gRPC over TCP and the whole HTTP listener "
               "(/metrics, the status page) (a trusted network only)");
  app.add_option("--tls-cert", tls_files.cert, "PEM certificate of the TCP listener");
  app.add_option("--tls-key", tls_files.key, "PEM private key of the TCP listener");
  app.add_option("--tls-client-ca", tls_files.client_ca,
                 "Require TCP clients to present a certificate signed by this CA");
  app.add_option("--cluster-ca", tls_files.cluster_ca,
                 "CA of an etcd cluster's member certificates (their --tls-cert): members speak "
                 "mutual TLS to one another, and a forwarded call is believed only from one");
  app.add_flag("--allow-plaintext-tcp", options.allow_plaintext_tcp,
               "Listen on a non-loopback address without TLS (a trusted network only)");
  app.add_flag("--no-auth", no_auth,
               "No job tokens: any client may act on any job (benchmarks, trusted rigs)");
  // Every flag above may also come from the environment or the config file (flag_sources.h).
  if (std::optional<int> exit_code = service::ParseFlagSources(app, argc, argv)) return *exit_code;
  if (!SetLogLevel(log_level)) return UsageError("--log-level: unknown level '" + log_level + "'");
  if (log_format == "text" || log_format == "json") {
    log_options.format = log_format == "json" ? LogFormat::kJson : LogFormat::kText;
  } else {
    return UsageError("--log-format: expected text or json, got '" + log_format + "'");
  }
  if (absl::Status s = ConfigureLogs(log_options); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  absl::Duration drain_bound;
  if (!absl::ParseDuration(drain_timeout, &drain_bound) || drain_bound < absl::ZeroDuration() ||
      drain_bound > absl::Hours(1)) {
    return UsageError("--drain-timeout: expected a duration up to 1h like 10s, got '" +
                      drain_timeout.substr(0, 64) + "'");
  }
  // A FAKE FOR TESTS ONLY: makes the daemon's timer thread stuck (DaemonOptions).
  if (const char* stall = std::getenv("ZEROD_TEST_STALL_LOOP_AFTER"); stall != nullptr) {
    if (!absl::ParseDuration(stall, &options.test_stall_loop_after)) {
      return UsageError(std::string("ZEROD_TEST_STALL_LOOP_AFTER: expected a duration, got '") +
                        stall + "'");
    }
  }
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
  if (absl::Status s = zerod::server::CheckStoreFlag(options.store); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (options.store == "sqlite" &&
      (!etcd_files.empty() || !tls_files.cluster_ca.empty() || options.allow_insecure_etcd)) {
    return UsageError(
        "--etcd-ca, --etcd-cert, --etcd-key, --allow-insecure-etcd and --cluster-ca are for a "
        "zerod on etcd (--store etcd://...)");
  }
  // Every certificate and key is read here, once: a file zerod cannot use is a usage error.
  if (absl::Status s = LoadCredentials(tls_files, etcd_files, &options); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (sync == "full") {
    options.durability = Durability::kFull;
  } else if (sync == "normal") {
    options.durability = Durability::kNormal;
  } else {
    return UsageError("--sync: expected full or normal, got '" + sync + "'");
  }
  // A host name or an IP address, as Gloo resolves it (no port, no brackets: a colon only in an
  // IPv6 address).
  in6_addr ipv6{};
  if (options.node_address.size() > 253 ||
      !std::all_of(
          options.node_address.begin(), options.node_address.end(),
          [](char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == ':'; }) ||
      (absl::StrContains(options.node_address, ':') &&
       inet_pton(AF_INET6, options.node_address.c_str(), &ipv6) != 1)) {
    return UsageError("--node-address: expected a host name or an IP address, got '" +
                      options.node_address.substr(0, 64) + "'");
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
             Bounded{"--etcd-max-txn-ops", options.etcd_max_txn_ops, 1, int64_t{1} << 30},
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

  if (!options.http_listen.empty()) {
    if (absl::Status s = zerod::http::CheckListenAddress(options.http_listen); !s.ok()) {
      return UsageError("--http-listen: " + std::string(s.message()));
    }
  }
  if (std::string problem = PortFileProblem(port_file, http_port_file); !problem.empty()) {
    return UsageError(problem);
  }
  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Bound first: a bad address is a usage error before any state is touched. NOT_SERVING until
  // the watchdog's first probe of the daemon's loops passes.
  std::unique_ptr<service::HealthListener> health;
  if (!health_listen.empty()) {
    auto started = service::HealthListener::Start(health_listen);
    if (!started.ok() && started.status().code() == absl::StatusCode::kInvalidArgument) {
      return UsageError(std::string(started.status().message()));
    }
    if (!started.ok()) {
      Logger("coordinator")->error("{}", std::string(started.status().message()));
      return 1;
    }
    health = *std::move(started);
  }
  service::NotifyStatus(options.store == "sqlite" ? "loading the state in " + options.data_dir
                                                  : "electing the leader of " + options.store);
  // SIGUSR1: an etcd cluster's leader claim changed (server/cluster/member.h); answered here, on
  // the main thread, by a new election.
  auto member = cluster::Member::Start(options, cluster_options, [] { kill(getpid(), SIGUSR1); });
  // A flag whose value is wrong (an unknown --socket-group, an unreadable --tls-cert) is named by
  // the message: a usage error.
  if (!member.ok() && member.status().code() == absl::StatusCode::kInvalidArgument &&
      absl::StartsWith(member.status().message(), "--")) {
    return UsageError(std::string(member.status().message()));
  }
  if (!member.ok() && absl::IsCancelled(member.status())) {
    Logger("coordinator")->info("{}: stopped", std::string(member.status().message()));
    return 0;
  }
  if (!member.ok()) {
    Logger("coordinator")->error("{}", std::string(member.status().message()));
    return 1;
  }
  auto write_ports = [&] {
    return WritePortFiles(port_file, (*member)->tcp_port(), http_port_file, (*member)->http_port());
  };
  if (!write_ports()) {
    member->reset();
    return 1;
  }
  // The state is loaded and every listener bound: a client connecting from now on is answered.
  service::NotifyReady((*member)->StatusLine());
  service::LivenessWatchdog::Hooks hooks{
      [raw = member->get()](absl::Duration timeout) { return raw->ProbeLoops(timeout); },
      [raw = member->get()] { return raw->StatusLine(); }, nullptr};
  if (health) hooks.report = [raw = health.get()](bool alive) { raw->SetServing(alive); };
  auto watchdog =
      std::make_unique<service::LivenessWatchdog>(service::WatchdogInterval(), std::move(hooks));
  int signal = 0;
  while (sigwait(&signals, &signal) == 0 && (signal == SIGHUP || signal == SIGUSR1)) {
    if (signal == SIGUSR1) {
      absl::Status s = (*member)->Reelect();
      if (absl::IsCancelled(s)) {  // SIGTERM came while electing: drain below
        signal = SIGTERM;
        break;
      }
      if (!s.ok()) {
        Logger("cluster")->error("{}", std::string(s.message()));
        watchdog.reset();
        member->reset();
        return 1;
      }
      (void)write_ports();
      service::NotifyStatus((*member)->StatusLine());
      continue;
    }
    // logrotate moved the file away: new lines go to a new file by the old name.
    if (absl::Status s = ReopenLogs(); s.ok()) {
      Logger("service")->info("SIGHUP: log file reopened");
    } else {
      Logger("service")->error("SIGHUP: {}; logging to the old file", std::string(s.message()));
    }
  }
  Logger("coordinator")->info("signal {} received: draining", signal);
  service::NotifyStopping("draining: answering waiting calls, in-flight ones up to " +
                          absl::FormatDuration(drain_bound));
  // From here the process ends within the bound, even if a stuck loop holds up the watchdog's last
  // probe or the drain itself.
  service::DrainBound bound(drain_bound);
  if (health) health->StopServing();  // final: later reports from the watchdog are ignored
  watchdog.reset();
  (*member)->Shutdown(drain_bound);
  member->reset();
  service::NotifyStatus("stopped");
  Logger("coordinator")->info("stopped");
  return 0;
}
