#include "server/clock.h"

#include <utility>

namespace zerod::server {

absl::Time FakeClock::Now() const {
  MutexLock lock(&mu_);
  return now_;
}

int64_t FakeClock::AddJumpObserver(std::function<void()> on_jump) const {
  MutexLock lock(&observers_mu_);
  const int64_t id = next_observer_id_++;
  observers_.emplace(id, std::move(on_jump));
  return id;
}

void FakeClock::RemoveJumpObserver(int64_t id) const {
  MutexLock lock(&observers_mu_);
  observers_.erase(id);
}

void FakeClock::Advance(absl::Duration d) {
  {
    MutexLock lock(&mu_);
    now_ += d;
  }
  // Observers read Now(), so mu_ is released before they run.
  MutexLock lock(&observers_mu_);
  for (const auto& [id, on_jump] : observers_) on_jump();
}

}  // namespace zerod::server
