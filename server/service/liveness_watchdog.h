#ifndef ZEROD_SERVER_SERVICE_LIVENESS_WATCHDOG_H_
#define ZEROD_SERVER_SERVICE_LIVENESS_WATCHDOG_H_

// LivenessWatchdog: pings the service manager's watchdog (WATCHDOG=1) only while the daemon proves
// it is alive, tells the health listener the same (Kubernetes' liveness probe), and keeps the
// STATUS= line current.
//
// A thread that pings on a timer proves only that the thread runs: it would go on pinging while
// every gRPC handler waits on a deadlocked lock, and systemd would never restart the daemon. So
// each round asks `probe` to prove the daemon's own loops ran something within part of the
// interval (Daemon::ProbeLoops: a health check through the gRPC server, a probe on the registry's
// timer thread, a recent lease sweep); no WATCHDOG=1 follows a probe that failed, and once the
// loops stay stuck for the whole WatchdogSec, systemd kills and restarts zerod.
//
// Owns one thread, started by the constructor and stopped (joined) by the destructor.

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"

namespace zerod::server::service {

class LivenessWatchdog {
 public:
  struct Hooks {
    // OK once the daemon's loops ran a probe, within `timeout`.
    std::function<absl::Status(absl::Duration timeout)> probe;
    // The STATUS= line for now ("serving: 3 jobs open"); sent when it changes.
    std::function<std::string()> status;
    // Told each probe's outcome (HealthListener::SetServing); may be empty.
    std::function<void(bool alive)> report;
  };

  // `interval`: the manager's WatchdogSec (WatchdogInterval()); rounds run four times in it, so
  // a ping is never later than half of it. nullopt: no pings; rounds every 2s while there is a
  // `report` to tell, else STATUS= every 5s and no probes.
  LivenessWatchdog(std::optional<absl::Duration> interval, Hooks hooks);
  ~LivenessWatchdog();
  LivenessWatchdog(const LivenessWatchdog&) = delete;
  LivenessWatchdog& operator=(const LivenessWatchdog&) = delete;

 private:
  void Loop();

  const std::optional<absl::Duration> interval_;
  const Hooks hooks_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zerod::server::service

#endif  // ZEROD_SERVER_SERVICE_LIVENESS_WATCHDOG_H_
