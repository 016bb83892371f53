#ifndef ZEROD_SERVER_STORE_QUOTA_H_
#define ZEROD_SERVER_STORE_QUOTA_H_

// StoreQuota: how much each job's Store holds (keys, and bytes of keys plus values) and the
// writes in flight, so that a write that would take a job past its limits is refused before it
// is committed and nothing of it is stored.
//
// What is held is learnt from the KvStore's committed changes (a watch on jobs/), so every way a
// key goes (a delete, a job's end, a removed job) counts, and the daemon's own records do not.
// A write reserves room for what it may add until its commit is answered: writes in flight
// together never pass a limit (they may be refused a little early when they overwrite each other).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/common/mutex.h"
#include "server/state/kv_store.h"

namespace zerod::server {

class StoreQuota {
 public:
  // Room held by one write until Release.
  struct Reservation {
    std::string job_id;
    int64_t keys = 0;
    int64_t bytes = 0;
  };

  // Counts what `kv` holds now and watches it. Construct it before anything commits to jobs/
  // (daemon start); `kv` must outlive it.
  StoreQuota(KvStore* kv, int64_t max_keys_per_job, int64_t max_bytes_per_job);
  ~StoreQuota();
  StoreQuota(const StoreQuota&) = delete;
  StoreQuota& operator=(const StoreQuota&) = delete;

  // Room to write `value_bytes` at `key` of `job_id`'s Store, or RESOURCE_EXHAUSTED naming the
  // job, the limit and the flag that sets it.
  absl::StatusOr<Reservation> Reserve(const std::string& job_id, const std::string& key,
                                      int64_t value_bytes);
  // Gives the room back once the write's commit was answered (its changes, if any, are counted
  // by then: the KvStore tells its watchers before it answers).
  void Release(const Reservation& reservation);

  // What `job_id`'s Store holds (committed), for tests.
  int64_t keys(const std::string& job_id) const;
  int64_t bytes(const std::string& job_id) const;

 private:
  struct Usage {
    std::map<std::string, int64_t> sizes;  // key -> bytes of key and value, as committed
    int64_t bytes = 0;
    int64_t reserved_keys = 0;
    int64_t reserved_bytes = 0;
  };
  void OnCommitted(const std::vector<KvEvent>& events);
  void Count(const std::string& full_key, const std::optional<std::string>& value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetIfEmpty(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  KvStore* const kv_;
  const int64_t max_keys_;
  const int64_t max_bytes_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Usage> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t watch_id_ = 0;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STORE_QUOTA_H_
