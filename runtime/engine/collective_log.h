#ifndef ZEROD_RUNTIME_ENGINE_COLLECTIVE_LOG_H_
#define ZEROD_RUNTIME_ENGINE_COLLECTIVE_LOG_H_

// A running digest of the collectives a rank has issued (kind, count, dtype, in order). Ranks
// compare theirs through the rendezvous Store, which works even when the collectives themselves
// are stuck, so a broken SPMD order becomes an error naming the ranks that diverged instead of a
// silent hang.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/comm/store.h"
#include "runtime/common/dtype.h"

namespace zerod::engine {

class CollectiveLog {
 public:
  void Record(absl::string_view kind, int64_t count, DType dtype);
  int64_t count() const { return count_; }
  uint64_t digest() const { return digest_; }
  const std::string& last() const { return last_; }

  // Publishes this rank's position under `tag` and compares it with every rank's. OK when all
  // agree; FAILED_PRECONDITION naming the ranks whose sequence differs from rank 0's, with their
  // last collectives; DEADLINE_EXCEEDED naming the ranks that did not report within `timeout`.
  absl::Status Compare(comm::Store& store, const std::string& tag, int64_t rank, int64_t world_size,
                       absl::Duration timeout) const;

 private:
  int64_t count_ = 0;
  uint64_t digest_ = 0x9e3779b97f4a7c15ull;
  std::string last_ = "none";
};

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_COLLECTIVE_LOG_H_
