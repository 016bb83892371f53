#ifndef ZEROD_SERVER_CLOCK_H_
#define ZEROD_SERVER_CLOCK_H_

// The daemon's time source, an interface so that leases and timeouts are testable without
// sleeping (leveldb's Env): RealClock in the daemon, FakeClock in tests.

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zerod::server {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_CLOCK_H_
