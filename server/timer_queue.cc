#include "server/timer_queue.h"

#include <utility>

#include "absl/time/clock.h"

namespace zerod::server {

TimerQueue::TimerQueue() : thread_([this] { Loop(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TimerQueue::Schedule(absl::Time deadline, std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  timers_.emplace(deadline, std::move(callback));
}

void TimerQueue::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    if (!timers_.empty() && timers_.begin()->first <= now) {
      std::function<void()> callback = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
      mu_.Unlock();
      callback();
      mu_.Lock();
      continue;
    }
    const absl::Time wake =
        timers_.empty() ? now + absl::Milliseconds(200) : timers_.begin()->first;
    // Wakes at the earliest deadline, when a new timer is added, or when stopping.
    const size_t count = timers_.size();
    auto changed = [this, count, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || timers_.size() != count ||
             (!timers_.empty() && timers_.begin()->first < wake);
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
  }
}

}  // namespace zerod::server
