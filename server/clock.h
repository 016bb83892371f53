#ifndef ZEROD_SERVER_CLOCK_H_
#define ZEROD_SERVER_CLOCK_H_

// The daemon's time source, an interface so that leases and timeouts are testable without
// sleeping (leveldb's Env): RealClock in the daemon, FakeClock in tests.
//
// Every deadline the server keeps (joins, blocking gets, barriers) is a time of its Clock. The
// daemon's is real time, which is also what gRPC's call deadlines are measured in.

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"

namespace zerod::server {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // Calls `on_jump` after every jump of a clock that does not move by itself (FakeClock::Advance),
  // so that whoever waits for a time of this clock (TimerQueue) can look again. Real time needs
  // no such call: its waiters time out by themselves. Returns an id for RemoveJumpObserver, which
  // returns only once no call to that observer is running. Const, as reading a clock is.
  virtual int64_t AddJumpObserver(std::function<void()> /*on_jump*/) const { return 0; }
  virtual void RemoveJumpObserver(int64_t /*id*/) const {}
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override;
  int64_t AddJumpObserver(std::function<void()> on_jump) const override;
  void RemoveJumpObserver(int64_t id) const override;

  // Moves time on, then calls every observer; returns after they return (a TimerQueue's observer
  // returns once every timer now due has run, so a timer callback must not call Advance).
  void Advance(absl::Duration d);

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  // Held while observers run, so that removing one waits for its call to end.
  mutable Mutex observers_mu_;
  mutable std::map<int64_t, std::function<void()>> observers_ ABSL_GUARDED_BY(observers_mu_);
  mutable int64_t next_observer_id_ ABSL_GUARDED_BY(observers_mu_) = 1;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_CLOCK_H_
