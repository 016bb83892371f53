#ifndef ZEROD_SERVER_SERVICE_SYSTEMD_NOTIFY_H_
#define ZEROD_SERVER_SERVICE_SYSTEMD_NOTIFY_H_

// What zerod tells its service manager, through sd_notify(3) on the datagram socket named by
// NOTIFY_SOCKET (systemd's Type=notify, or a test playing systemd). Without NOTIFY_SOCKET each call
// does nothing, so a daemon started by hand behaves as before.
//
// The order zerod keeps: STATUS= while loading, READY=1 once the state is loaded and every listener
// is bound (a client connecting after READY=1 is answered), STATUS= lines while serving,
// WATCHDOG=1 pings (liveness_watchdog.h), STOPPING=1 when a drain starts, STATUS= when stopped.

#include <optional>
#include <string_view>

#include "absl/time/time.h"

namespace zerod::server::service {

void NotifyStatus(std::string_view status);
void NotifyReady(std::string_view status);
void NotifyStopping(std::string_view status);
void NotifyWatchdog();

// The interval within which the manager expects WATCHDOG=1 (WATCHDOG_USEC, when WATCHDOG_PID is
// unset or names this process); nullopt when no watchdog is asked for.
std::optional<absl::Duration> WatchdogInterval();

}  // namespace zerod::server::service

#endif  // ZEROD_SERVER_SERVICE_SYSTEMD_NOTIFY_H_
