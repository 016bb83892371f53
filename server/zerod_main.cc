// zerod: the coordinator daemon. See README.md ("Running zerod").

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/common/units.h"
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
  std::string max_message = "64MiB", port_file;
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
  if (!absl::ParseDuration(lease_ttl, &options.lease_ttl) ||
      options.lease_ttl <= absl::ZeroDuration()) {
    return UsageError("--lease-ttl: expected a positive duration like 10s or 500ms, got '" +
                      lease_ttl + "'");
  }
  if (!absl::ParseDuration(restart_grace, &options.restart_grace) ||
      options.restart_grace < absl::ZeroDuration()) {
    return UsageError("--restart-grace: expected a duration like 10s, got '" + restart_grace + "'");
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

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto daemon = Daemon::Start(options);
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
