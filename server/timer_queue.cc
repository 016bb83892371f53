#include "server/timer_queue.h"

#include <utility>

#include "absl/time/clock.h"

namespace zerod::server {

TimerQueue::TimerQueue(const Clock* clock) : clock_(clock), thread_([this] { Loop(); }) {
  observer_id_ = clock_->AddJumpObserver([this] { OnClockJump(); });
}

TimerQueue::~TimerQueue() {
  // First, so that no Advance() waits on a loop that is gone.
  clock_->RemoveJumpObserver(observer_id_);
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TimerQueue::Schedule(absl::Time deadline, std::function<void()> callback) {
  MutexLock lock(&mu_);
  timers_.emplace(deadline, std::move(callback));
  ++scheduled_;
}

void TimerQueue::OnClockJump() {
  MutexLock lock(&mu_);
  const int64_t jump = ++jumps_;
  // Entering Await wakes the loop's wait, as a release would, so it sees the new jump.
  mu_.Await([this, jump]()
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || caught_up_ >= jump; });
}

void TimerQueue::Loop() {
  for (;;) {
    std::function<void()> callback;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      // Read before Now(): the time read is then at least that of the last jump counted.
      const int64_t jumps = jumps_;
      const absl::Time now = clock_->Now();
      if (!timers_.empty() && timers_.begin()->first <= now) {
        callback = std::move(timers_.extract(timers_.begin()).mapped());
      } else if (caught_up_ != jumps) {
        // Published by this scope's release, which wakes OnClockJump.
        caught_up_ = jumps;
        continue;
      } else {
        const int64_t scheduled = scheduled_;
        // Real time to wait: a FakeClock's deadlines are reached by jumps, not by waiting.
        const absl::Time wake =
            timers_.empty() ? absl::InfiniteFuture() : absl::Now() + (timers_.begin()->first - now);
        mu_.AwaitWithDeadline(
            [this, scheduled, jumps]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return stopping_ || scheduled_ != scheduled || jumps_ != jumps;
            },
            wake);
        continue;
      }
    }
    callback();
  }
}

}  // namespace zerod::server
