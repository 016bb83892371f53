#ifndef ZEROD_RUNTIME_ENGINE_SHARD_EXCHANGE_H_
#define ZEROD_RUNTIME_ENGINE_SHARD_EXCHANGE_H_

// ShardExchange: stage-3 gathers without a collective, for ranks that all run on one host.
//
// Each rank's parameter shard (the engine's params buffer) lives in a POSIX shared-memory object
// that every rank of the job maps. A rank gathers a unit by copying every rank's slice of it
// itself ("pull"): no peer takes part, so ranks may gather different units, in different orders,
// or a unit only one of them needs (a branch some ranks take), and a gather never waits behind a
// collective. The shards change only in write phases that every rank runs at the same point of
// the program (the optimizer step, setting parameters, a restore):
//   BeginWrite: this rank says it will read the shards as they are no more, and waits until
//               every rank has said so (nobody reads what it is about to overwrite);
//   EndWrite:   this rank publishes its new shard (its phase count).
// A pull of rank r's slices first waits until r has published the phase this rank is at. So a
// gather sees every shard as of the same step, and a write never overlaps a read. These waits are
// invisible to the collective-order check: the engine runs a barrier on its communicator before
// BeginWrite, so a rank that is elsewhere is named there, and BeginWrite only confirms.
//
// Layout: each rank's object (mode 0600, named /zerod-shard-<pid>-<random>, unlinked once every
// rank has answered whether it mapped it) is a page of counters, then the shard. Who uses it:
// every rank or none: unless every rank mapped every other's (ranks on several hosts, separate
// /dev/shm, no room), Connect gives null and the engine gathers with all-gathers as before.
//
// Threads: Pull runs its copies on a thread this object owns (so a prefetch overlaps the layers
// computed before it is needed); the destructor stops and joins it after the pulls queued.
// The rest is called from the engine's thread; Abort from any.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"

namespace zerod::engine {

class ShardExchange {
 public:
  // One copy of a pull: `bytes` at `offset` in rank `rank`'s shard to `to`.
  struct Copy {
    int64_t rank = 0;
    int64_t offset = 0;
    int64_t bytes = 0;
    char* to = nullptr;
  };

  // Creates this rank's shard of `bytes` (zero-filled) and maps every rank's, agreeing through
  // `store` (keys under `prefix`; every rank calls it). Null when some rank could not map every
  // other's, or `enabled` is false on some rank; an error only when the store fails.
  static absl::StatusOr<std::unique_ptr<ShardExchange>> Connect(comm::Store& store,
                                                                const std::string& prefix,
                                                                int64_t rank, int64_t world,
                                                                int64_t bytes, bool enabled,
                                                                absl::Duration timeout);
  ~ShardExchange();
  ShardExchange(const ShardExchange&) = delete;
  ShardExchange& operator=(const ShardExchange&) = delete;

  int64_t rank() const { return rank_; }
  int64_t bytes() const { return bytes_; }
  // This rank's shard: the engine's params buffer.
  char* own() { return shards_[static_cast<size_t>(rank_)]; }

  // See the header comment. BeginWrite fails (naming the ranks) when some rank does not arrive
  // within `timeout`, or the exchange was aborted.
  absl::Status BeginWrite(absl::Duration timeout);
  void EndWrite();
  // Every copy, each once its rank has published the phase this rank is at, on the exchange's
  // thread; the Work's Wait says when they are done (or why not). Start is a no-op: a pull starts
  // at once.
  std::unique_ptr<comm::Work> Pull(std::vector<Copy> copies, absl::Duration timeout);
  // Fails every wait, here and from now on, with `why` (the job lost a rank).
  void Abort(const absl::Status& why);
  // Pulls run and bytes copied from other ranks' shards, any thread.
  int64_t pulls() const { return pulls_.load(std::memory_order_relaxed); }
  int64_t bytes_pulled() const { return bytes_pulled_.load(std::memory_order_relaxed); }

  struct Header;  // the counters at the start of each object (defined in the .cc)

 private:
  struct Job;
  class PullWork;

  ShardExchange(int64_t rank, int64_t world, int64_t bytes, std::vector<char*> bases,
                size_t mapped_bytes);
  Header& HeaderOf(int64_t rank) const;
  // Waits until `done` holds, polling; fails at `deadline` naming `what`, or when aborted.
  absl::Status Await(const std::function<bool()>& done, absl::Time deadline,
                     const std::string& what);
  absl::Status RunCopies(const std::vector<Copy>& copies, uint64_t phase, absl::Time deadline);
  void Loop();

  const int64_t rank_;
  const int64_t world_;
  const int64_t bytes_;
  const size_t mapped_bytes_;
  std::vector<char*> bases_;   // each rank's mapping: header, then shard
  std::vector<char*> shards_;  // each rank's shard
  uint64_t phase_ = 0;         // write phases this rank has completed (engine thread)

  std::atomic<bool> aborted_{false};
  Mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);

  Mutex mu_;
  std::deque<std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::atomic<int64_t> pulls_{0};
  std::atomic<int64_t> bytes_pulled_{0};
};

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_SHARD_EXCHANGE_H_
