#ifndef ZEROD_SERVER_JOB_STORE_H_
#define ZEROD_SERVER_JOB_STORE_H_

// JobStore: each job's Store (the keys its ranks rendezvous through: set, get, add,
// compare-set, delete, wait, barrier) kept in the KvStore under jobs/<job>/kv/. It knows nothing
// of gRPC: StoreService translates calls into these methods.
//
// A write that would take a job's Store past StoreLimits' keys or bytes per job is refused with
// RESOURCE_EXHAUSTED before anything is stored (StoreQuota).
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
#include "server/store_quota.h"
#include "server/store_waits.h"

namespace zerod::server {

// zerod's --max-key-bytes, --max-value, --max-store-keys and --max-store-bytes.
struct StoreLimits {
  int64_t max_key_bytes = 1024;
  int64_t max_value_bytes = 4 << 20;
  absl::Duration longest_wait = absl::Hours(1);
  // What one job's Store may hold: keys (barrier arrivals included), and bytes of keys and values.
  // A 100,000-rank job's rendezvous takes a few keys and a few hundred bytes per rank.
  int64_t max_keys_per_job = int64_t{1} << 20;
  int64_t max_bytes_per_job = int64_t{256} << 20;
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
  // OK when the job may use its Store; else the error to answer (NOT_FOUND, or DATA_LOSS for a
  // quarantined job).
  using JobCheck = std::function<absl::Status(const std::string& job_id)>;
  template <class T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  // `kv` and `clock` must outlive this; `job_check` says which jobs may use their Store.
  JobStore(KvStore* kv, const Clock* clock, JobCheck job_check, StoreLimits limits);
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
  // kv_->Commit, counted so that the destructor can wait for `done`; gives `reservation` back
  // once the commit is answered.
  void Commit(std::vector<KvOp> ops, KvStore::CommitCallback done,
              std::optional<StoreQuota::Reservation> reservation = std::nullopt);

  KvStore* const kv_;
  const Clock* const clock_;
  const JobCheck job_check_;
  const StoreLimits limits_;
  Mutex mu_;
  int64_t commits_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  StoreQuota quota_;
  StoreWaits waits_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOB_STORE_H_
