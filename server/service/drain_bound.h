#ifndef ZEROD_SERVER_SERVICE_DRAIN_BOUND_H_
#define ZEROD_SERVER_SERVICE_DRAIN_BOUND_H_

// DrainBound: while it lives, a drain that overruns its bound (--drain-timeout plus kFlushMargin
// for the state's last commits) ends the process with exit code 1, instead of leaving it to the
// service manager's SIGKILL. What is lost then was never acknowledged: a commit is answered only
// once it is on disk.
//
// Owns one thread, stopped (joined) by the destructor.

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace zerod::server::service {

inline constexpr absl::Duration kFlushMargin = absl::Seconds(5);

class DrainBound {
 public:
  explicit DrainBound(absl::Duration drain_timeout);
  ~DrainBound();
  DrainBound(const DrainBound&) = delete;
  DrainBound& operator=(const DrainBound&) = delete;

 private:
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace zerod::server::service

#endif  // ZEROD_SERVER_SERVICE_DRAIN_BOUND_H_
