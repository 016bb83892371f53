#ifndef ZEROD_RUNTIME_COMMON_MUTEX_H_
#define ZEROD_RUNTIME_COMMON_MUTEX_H_

// Mutex: the lock every zerod class uses for shared state, annotated for clang's
// -Wthread-safety (ABSL_GUARDED_BY and friends check against it) and visible to ThreadSanitizer.
//
// Why not absl::Mutex: Debian's abseil is not built with TSan, so absl::Mutex's futex-based
// hand-offs are invisible to it and every guarded access reads as a race. This is std::mutex
// (pthread, which TSan intercepts) plus the one absl::Mutex feature our code relies on, Await: a
// waiter's condition is re-evaluated whenever the mutex is released by anyone, so nobody has to
// remember to signal. Conditions must be pure functions of state guarded by this mutex.
//
// The cost: Unlock() checks a counter, and wakes every waiter when there are any. A zerod mutex has
// few waiters (a worker thread or pool, a rank's join, a barrier), so that is cheap.

#include <condition_variable>
#include <functional>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace zerod {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION();
  // Tells the analysis the lock is held where it cannot see it (a callback run under the lock).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // Blocks until `condition()` is true. Called and returns with the mutex held; `condition` runs
  // with it held, and is re-evaluated each time the mutex is released (by Unlock, or by another
  // thread starting to wait).
  void Await(const std::function<bool()>& condition) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);
  // As Await, giving up at `deadline` (wall time, as absl::Now). Returns condition().
  bool AwaitWithDeadline(const std::function<bool()>& condition, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);
  bool AwaitWithTimeout(const std::function<bool()>& condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);

 private:
  std::mutex mu_;
  std::condition_variable released_;
  int waiters_ = 0;  // guarded by mu_ (not annotated: mu_ is the raw std::mutex)
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A one-shot event: Notify() once, any number of threads wait for it.
class Notification {
 public:
  void Notify();
  bool HasBeenNotified() const;
  void WaitForNotification() const;
  // Returns whether it was notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const;

 private:
  mutable Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_MUTEX_H_
