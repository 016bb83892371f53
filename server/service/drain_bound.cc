#include "server/service/drain_bound.h"

#include <unistd.h>

#include "server/logging.h"
#include "server/service/systemd_notify.h"

namespace zerod::server::service {

DrainBound::DrainBound(absl::Duration drain_timeout) {
  thread_ = std::thread([this, bound = drain_timeout + kFlushMargin] {
    if (done_.WaitForNotificationWithTimeout(bound)) return;
    Logger("coordinator")
        ->error("the drain took longer than {}; exiting without it (unacknowledged commits only)",
                absl::FormatDuration(bound));
    NotifyStatus("drain overran its bound; exited");
    _exit(1);
  });
}

DrainBound::~DrainBound() {
  done_.Notify();
  thread_.join();
}

}  // namespace zerod::server::service
