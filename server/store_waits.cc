#include "server/store_waits.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zerod::server {
namespace {

absl::Status ShuttingDown() { return absl::UnavailableError("zerod is shutting down; retry"); }

}  // namespace

void StoreWaiter::Complete(absl::Status status) {
  if (completed_.exchange(true)) return;
  done_(std::move(status));
}

StoreWaits::StoreWaits(KvStore* kv, const Clock* clock, const std::string& prefix)
    : kv_(kv), timers_(clock) {
  watch_id_ =
      kv_->Watch(prefix, [this](const std::vector<KvEvent>& events) { OnCommitted(events); });
}

StoreWaits::~StoreWaits() { kv_->Unwatch(watch_id_); }

void StoreWaits::AwaitKeys(const std::shared_ptr<StoreWaiter>& waiter,
                           const std::vector<std::string>& keys, absl::Time deadline) {
  absl::Status answer;
  {
    // Checking and registering under mu_ loses no wake-up: a commit publishes its data before
    // OnCommitted, which takes mu_, looks for waiters.
    MutexLock lock(&mu_);
    if (shut_down_) {
      answer = ShuttingDown();
    } else {
      MutexLock waiter_lock(&waiter->mu_);
      for (const std::string& k : keys) {
        if (kv_->Get(k).has_value() || !waiter->missing_.insert(k).second) continue;
        by_key_.emplace(k, waiter);
      }
      if (!waiter->missing_.empty()) {
        timers_.Schedule(deadline, [this, waiter] { KeysTimedOut(waiter); });
        return;
      }
    }
  }
  waiter->Complete(std::move(answer));
}

void StoreWaits::KeysTimedOut(const std::shared_ptr<StoreWaiter>& waiter) {
  std::string missing;
  {
    MutexLock lock(&mu_);
    MutexLock waiter_lock(&waiter->mu_);
    for (const std::string& k : waiter->missing_) {
      auto [begin, end] = by_key_.equal_range(k);
      for (auto it = begin; it != end;) {
        it = it->second == waiter ? by_key_.erase(it) : std::next(it);
      }
    }
    // A few keys name the wait; a wait for a million keys does not get a million-key message.
    constexpr size_t kShown = 8;
    size_t shown = 0;
    for (const std::string& k : waiter->missing_) {
      if (shown == kShown) {
        absl::StrAppend(&missing, ", ... (", waiter->missing_.size(), " keys)");
        break;
      }
      absl::StrAppend(&missing, shown++ == 0 ? "" : ", ", k);
    }
  }
  waiter->Complete(absl::DeadlineExceededError(absl::StrCat("keys not set in time: ", missing)));
}

void StoreWaits::AwaitBarrier(const std::shared_ptr<StoreWaiter>& waiter, const std::string& prefix,
                              int64_t count, absl::Time deadline) {
  absl::Status answer;
  {
    MutexLock lock(&mu_);
    if (shut_down_) {
      answer = ShuttingDown();
    } else {
      Barrier& barrier = barriers_[prefix];
      if (barrier.waiters.empty()) {
        // Nobody watched this barrier: participants that arrived before are only in the store.
        for (const KeyValue& kv : kv_->Range(prefix)) {
          barrier.arrived.insert(kv.key.substr(prefix.size()));
        }
      }
      if (static_cast<int64_t>(barrier.arrived.size()) < count) {
        barrier.waiters.emplace_back(count, waiter);
        timers_.Schedule(deadline, [this, prefix, waiter] { BarrierTimedOut(prefix, waiter); });
        return;
      }
      if (barrier.waiters.empty()) barriers_.erase(prefix);
    }
  }
  waiter->Complete(std::move(answer));
}

void StoreWaits::BarrierTimedOut(const std::string& prefix,
                                 const std::shared_ptr<StoreWaiter>& waiter) {
  {
    // Forget the waiter, so that a barrier that never completes does not keep it.
    MutexLock lock(&mu_);
    auto barrier = barriers_.find(prefix);
    if (barrier != barriers_.end()) {
      auto& waiters = barrier->second.waiters;
      waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                   [&](const auto& w) { return w.second == waiter; }),
                    waiters.end());
      if (waiters.empty()) barriers_.erase(barrier);
    }
  }
  waiter->Complete(absl::DeadlineExceededError(""));
}

void StoreWaits::OnCommitted(const std::vector<KvEvent>& events) {
  std::vector<std::shared_ptr<StoreWaiter>> ready;
  {
    MutexLock lock(&mu_);
    for (const KvEvent& e : events) {
      if (!e.value.has_value()) continue;
      auto [begin, end] = by_key_.equal_range(e.key);
      for (auto it = begin; it != end;) {
        std::shared_ptr<StoreWaiter> w = it->second;
        it = by_key_.erase(it);
        MutexLock waiter_lock(&w->mu_);
        w->missing_.erase(e.key);
        if (w->missing_.empty()) ready.push_back(w);
      }
      const size_t slash = e.key.rfind('/');
      if (slash == std::string::npos) continue;
      auto barrier = barriers_.find(e.key.substr(0, slash + 1));
      if (barrier == barriers_.end()) continue;
      barrier->second.arrived.insert(e.key.substr(slash + 1));
      auto& waiters = barrier->second.waiters;
      const int64_t arrived = static_cast<int64_t>(barrier->second.arrived.size());
      for (auto w = waiters.begin(); w != waiters.end();) {
        if (arrived >= w->first) {
          ready.push_back(std::move(w->second));
          w = waiters.erase(w);
        } else {
          ++w;
        }
      }
      if (waiters.empty()) barriers_.erase(barrier);
    }
  }
  // Outside mu_: an answer may start another wait.
  for (const auto& w : ready) w->Complete(absl::OkStatus());
}

void StoreWaits::Shutdown() {
  std::vector<std::shared_ptr<StoreWaiter>> all;
  {
    MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [key, w] : by_key_) all.push_back(w);
    by_key_.clear();
    for (auto& [prefix, barrier] : barriers_) {
      for (auto& [count, w] : barrier.waiters) all.push_back(w);
    }
    barriers_.clear();
  }
  for (const auto& w : all) w->Complete(ShuttingDown());
}

}  // namespace zerod::server
