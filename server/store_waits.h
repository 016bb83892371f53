#ifndef ZEROD_SERVER_STORE_WAITS_H_
#define ZEROD_SERVER_STORE_WAITS_H_

// StoreWaits: calls that wait on a KvStore, for keys to exist (blocking get, wait) or for a
// barrier's participants to arrive. A waiting call holds no thread: the commit that brings what
// it waits for completes it (on the KvStore's writer thread), else its deadline does (on a
// TimerQueue thread that StoreWaits owns, against its Clock), else Shutdown.
//
// Barrier participant p of a barrier whose keys live under prefix P arrives by setting key P + p.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"
#include "server/state/kv_store.h"
#include "server/timer_queue.h"

namespace zerod::server {

// One waiting call. Whoever completes it first (a commit, its deadline, Shutdown, a failed write
// of the caller's) answers it; later completions do nothing.
class StoreWaiter {
 public:
  explicit StoreWaiter(std::function<void(absl::Status)> done) : done_(std::move(done)) {}
  void Complete(absl::Status status);

 private:
  friend class StoreWaits;
  std::atomic<bool> completed_{false};
  std::function<void(absl::Status)> done_;
  Mutex mu_;
  std::set<std::string> missing_ ABSL_GUARDED_BY(mu_);  // keys it still waits for
};

class StoreWaits {
 public:
  // Watches `kv` under `prefix` (every key waited for must be under it). `kv` and `clock` must
  // outlive this.
  StoreWaits(KvStore* kv, const Clock* clock, const std::string& prefix);
  ~StoreWaits();
  StoreWaits(const StoreWaits&) = delete;
  StoreWaits& operator=(const StoreWaits&) = delete;

  // Completes `waiter` with OK once every key exists (at once, on this thread, if they do), or at
  // `deadline` with DEADLINE_EXCEEDED "keys not set in time: <the keys missing>".
  void AwaitKeys(const std::shared_ptr<StoreWaiter>& waiter, const std::vector<std::string>& keys,
                 absl::Time deadline);
  // Completes `waiter` with OK once `count` distinct participants arrived under `prefix` (those
  // already there count), or at `deadline` with DEADLINE_EXCEEDED and an empty message.
  void AwaitBarrier(const std::shared_ptr<StoreWaiter>& waiter, const std::string& prefix,
                    int64_t count, absl::Time deadline);

  // Completes every waiting call with UNAVAILABLE (daemon shutdown), and every later one at once.
  void Shutdown();

 private:
  void KeysTimedOut(const std::shared_ptr<StoreWaiter>& waiter);
  void BarrierTimedOut(const std::string& prefix, const std::shared_ptr<StoreWaiter>& waiter);
  void OnCommitted(const std::vector<KvEvent>& events);

  struct Barrier {
    std::set<std::string> arrived;
    std::vector<std::pair<int64_t, std::shared_ptr<StoreWaiter>>> waiters;  // (count, waiter)
  };

  KvStore* const kv_;
  Mutex mu_;
  // Waiters by the key they still miss.
  std::multimap<std::string, std::shared_ptr<StoreWaiter>> by_key_ ABSL_GUARDED_BY(mu_);
  // Barriers someone waits on, by prefix.
  absl::flat_hash_map<std::string, Barrier> barriers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t watch_id_ = 0;
  // Last: destroyed first, so no timer runs against a half-destroyed object.
  TimerQueue timers_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STORE_WAITS_H_
