#include "server/service/liveness_watchdog.h"

#include "absl/time/clock.h"
#include "server/logging.h"
#include "server/service/systemd_notify.h"

namespace zerod::server::service {

LivenessWatchdog::LivenessWatchdog(std::optional<absl::Duration> interval, Hooks hooks)
    : interval_(interval), hooks_(std::move(hooks)) {
  if (interval_) {
    Logger("service")->info("watchdog: pinging the service manager every {} while the loops answer",
                            absl::FormatDuration(*interval_ / 4));
  }
  thread_ = std::thread([this] { Loop(); });
}

LivenessWatchdog::~LivenessWatchdog() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void LivenessWatchdog::Loop() {
  const bool probing = interval_.has_value() || hooks_.report != nullptr;
  const absl::Duration round =
      interval_ ? *interval_ / 4 : (probing ? absl::Seconds(2) : absl::Seconds(5));
  std::string last_status;
  bool failing = false;
  while (true) {
    const absl::Time next = absl::Now() + round;
    if (probing) {
      const absl::Status alive = hooks_.probe(round);
      if (alive.ok() && interval_) NotifyWatchdog();
      if (hooks_.report) hooks_.report(alive.ok());
      if (alive.ok() && failing) {
        Logger("service")->info("watchdog: the loops answer again");
      } else if (!alive.ok() && !failing) {
        // Once, not every round: the loops stay stuck until the daemon is restarted.
        Logger("service")->error(
            "watchdog: the daemon's loops do not answer ({}); no WATCHDOG=1 and health "
            "NOT_SERVING until they do",
            std::string(alive.message()));
      }
      failing = !alive.ok();
    }
    if (std::string status = hooks_.status(); status != last_status) {
      NotifyStatus(status);
      last_status = std::move(status);
    }
    MutexLock lock(&mu_);
    if (mu_.AwaitWithDeadline([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                              next)) {
      return;
    }
  }
}

}  // namespace zerod::server::service
