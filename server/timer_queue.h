#ifndef ZEROD_SERVER_TIMER_QUEUE_H_
#define ZEROD_SERVER_TIMER_QUEUE_H_

// Runs callbacks at deadlines of a Clock, on one thread that it owns: the timeouts of calls that
// wait server-side (join, blocking get, barrier) without a thread per call. A callback must not
// block; it runs even if the call it belongs to finished early, and then does nothing. The
// destructor stops the thread and drops callbacks that have not run.
//
// With a FakeClock, Advance() returns once every callback due at the new time has run, so tests
// of timeouts neither sleep nor poll.

#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"

namespace zerod::server {

class TimerQueue {
 public:
  explicit TimerQueue(const Clock* clock);
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `callback` on the queue's thread once the clock reaches `deadline` (soon, if it has).
  void Schedule(absl::Time deadline, std::function<void()> callback);

 private:
  void Loop();
  // The clock jumped: waits until the loop has run everything due at the new time.
  void OnClockJump();

  const Clock* const clock_;
  Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  int64_t scheduled_ ABSL_GUARDED_BY(mu_) = 0;  // timers ever added: the loop's wake-up
  int64_t jumps_ ABSL_GUARDED_BY(mu_) = 0;      // clock jumps seen
  int64_t caught_up_ ABSL_GUARDED_BY(mu_) = 0;  // jumps after which nothing due was left
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t observer_id_ = 0;
  std::thread thread_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_TIMER_QUEUE_H_
