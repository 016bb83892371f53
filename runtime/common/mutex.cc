#include "runtime/common/mutex.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"

namespace zerod {

void Mutex::Unlock() {
  // Notified before unlocking: once unlocked, the owner of this Mutex may destroy it at once.
  if (waiters_ > 0) released_.notify_all();
  mu_.unlock();
}

void Mutex::Await(const std::function<bool()>& condition) {
  AwaitWithDeadline(condition, absl::InfiniteFuture());
}

bool Mutex::AwaitWithDeadline(const std::function<bool()>& condition, absl::Time deadline) {
  // The caller holds mu_; the condition variable borrows that hold and gives it back.
  std::unique_lock<std::mutex> held(mu_, std::adopt_lock);
  bool met = condition();
  if (!met && waiters_ > 0) {
    // Waiting releases mu_ without Unlock(), yet this thread may have changed the state since it
    // locked: wake the others as Unlock() would, or a waiter for that change sleeps forever.
    // Only here: a waiter that wakes and waits again has changed nothing.
    released_.notify_all();
  }
  ++waiters_;
  while (!met) {
    if (deadline == absl::InfiniteFuture()) {
      released_.wait(held);
    } else {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      // Steady time for the wait itself, so a wall-clock step cannot stretch it.
      released_.wait_for(held, absl::ToChronoNanoseconds(std::min(left, absl::Hours(24))));
    }
    met = condition();
  }
  --waiters_;
  held.release();
  return met;
}

bool Mutex::AwaitWithTimeout(const std::function<bool()>& condition, absl::Duration timeout) {
  return AwaitWithDeadline(condition, absl::Now() + timeout);
}

void Notification::Notify() {
  MutexLock lock(&mu_);
  notified_ = true;
}

bool Notification::HasBeenNotified() const {
  MutexLock lock(&mu_);
  return notified_;
}

void Notification::WaitForNotification() const {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_; });
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notified_; },
                              timeout);
}

}  // namespace zerod
