#ifndef ZEROD_SERVER_TIMER_QUEUE_H_
#define ZEROD_SERVER_TIMER_QUEUE_H_

// Runs callbacks at deadlines on one thread: the timeouts of calls that wait server-side (join,
// blocking get, barrier) without a thread per call. A callback must not block; it runs even if
// the call it belongs to finished early, and then does nothing. The destructor stops the thread
// and drops callbacks that have not run.

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zerod::server {

class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Real time: these are deadlines of RPCs, which gRPC measures in real time too.
  void Schedule(absl::Time deadline, std::function<void()> callback);

 private:
  void Loop();

  absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_TIMER_QUEUE_H_
