#ifndef ZEROD_SERVER_JOB_STORE_H_
#define ZEROD_SERVER_JOB_STORE_H_

// JobStore: each job's Store (the keys its ranks rendezvous through: set, get, add,
// compare-set, delete, wait, barrier) kept in the KvStore under jobs/<job>/kv/. It knows nothing
// of gRPC: StoreService translates calls into these methods.
//
// Every `done` runs exactly once, never under a lock of JobStore's: at once on bad input, on the
// KvStore's writer thread after a write, or for a waiting call when what it waits for is
// committed, at its deadline (a time of the Clock), or at Shutdown. Owns StoreWaits' timer thread.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"
#include "server/state/kv_store.h"
#include "server/store_waits.h"

namespace zerod::server {

struct StoreLimits {
  int64_t max_key_bytes = 1024;
  int64_t max_value_bytes = 4 << 20;
  absl::Duration longest_wait = absl::Hours(1);
};

// When a waiting call gives up: after its own timeout (<= 0: at once; capped at
// StoreLimits::longest_wait), and never after the deadline of the RPC that carries it.
struct WaitLimit {
  absl::Duration timeout;
  absl::Time call_deadline = absl::InfiniteFuture();
};

struct CompareSetResult {
  bool swapped = false;
  std::string value;  // stored now, either way (empty when absent)
};

class JobStore {
 public:
  using JobExists = std::function<bool(const std::string& job_id)>;
  template <class T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  // `kv` and `clock` must outlive this; `job_exists` says which jobs may use their Store.
  JobStore(KvStore* kv, const Clock* clock, JobExists job_exists, StoreLimits limits);
  // Waits for the callbacks of its commits still in flight.
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Answers the new revision.
  void Set(const std::string& job_id, const std::string& key, std::string value,
           Done<int64_t> done);
  // Answers the key's value and revision; waits for the key up to `limit`.
  void Get(const std::string& job_id, const std::string& key, WaitLimit limit, Done<KeyValue> done);
  // Adds `delta` to the decimal integer at `key` (missing: 0); answers the sum.
  void Add(const std::string& job_id, const std::string& key, int64_t delta, Done<int64_t> done);
  // Sets `key` to `desired` if it holds `expected` (nullopt: if it is absent).
  void CompareSet(const std::string& job_id, const std::string& key,
                  std::optional<std::string> expected, std::string desired,
                  Done<CompareSetResult> done);
  // Answers whether the key existed.
  void Delete(const std::string& job_id, const std::string& key, Done<bool> done);
  // Answers once every key exists.
  void Wait(const std::string& job_id, const std::vector<std::string>& keys, WaitLimit limit,
            std::function<void(absl::Status)> done);
  // Records `participant` at barrier `name`; answers once `count` distinct participants have.
  void Barrier(const std::string& job_id, const std::string& name, int64_t participant,
               int64_t count, WaitLimit limit, std::function<void(absl::Status)> done);

  // Answers every waiting call with UNAVAILABLE (daemon shutdown).
  void Shutdown() { waits_.Shutdown(); }

 private:
  // The value size limit, for every call that writes one.
  absl::Status CheckValue(const std::string& job_id, const std::string& key,
                          const std::string& value) const;
  absl::Status CheckJobAndKey(const std::string& job_id, const std::string& key) const;
  absl::Time Deadline(const WaitLimit& limit) const;
  // kv_->Commit, counted so that the destructor can wait for `done`.
  void Commit(std::vector<KvOp> ops, KvStore::CommitCallback done);

  KvStore* const kv_;
  const Clock* const clock_;
  const JobExists job_exists_;
  const StoreLimits limits_;
  Mutex mu_;
  int64_t commits_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  StoreWaits waits_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOB_STORE_H_
