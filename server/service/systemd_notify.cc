#include "server/service/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/logging.h"

namespace zerod::server::service {
namespace {

void Notify(const std::string& message) {
  // 0: keep NOTIFY_SOCKET in the environment; the watchdog thread and the drain notify later.
  const int sent = sd_notify(0, message.c_str());
  if (sent < 0) {
    Logger("service")->warn("cannot notify the service manager ({}): {}", message,
                            std::string(std::strerror(-sent)));
  }
}

// A status is one line: a newline would start another assignment.
std::string OneLine(std::string_view text) {
  std::string line(text);
  for (char& c : line) c = c == '\n' ? ' ' : c;
  return line;
}

}  // namespace

void NotifyStatus(std::string_view status) { Notify(absl::StrCat("STATUS=", OneLine(status))); }

void NotifyReady(std::string_view status) {
  Notify(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

void NotifyStopping(std::string_view status) {
  Notify(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

void NotifyWatchdog() { Notify("WATCHDOG=1"); }

std::optional<absl::Duration> WatchdogInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
  return absl::Microseconds(static_cast<int64_t>(usec));
}

}  // namespace zerod::server::service
