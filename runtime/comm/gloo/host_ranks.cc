#include "runtime/comm/gloo/host_ranks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zerod::comm::internal {

absl::StatusOr<int64_t> RanksSharingHost(Store& store, const std::string& key_prefix, int64_t rank,
                                         int64_t world, const std::string& hostname,
                                         absl::Duration timeout) {
  if (world <= 1) return world;
  if (absl::Status s = store.Set(absl::StrCat(key_prefix, rank), hostname); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  int64_t sharing = 1;
  for (int64_t peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    absl::StatusOr<std::string> theirs = store.Get(
        absl::StrCat(key_prefix, peer), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!theirs.ok()) {
      return absl::Status(
          theirs.status().code(),
          absl::StrCat("rank ", peer, " gave no address: ", theirs.status().message()));
    }
    if (*theirs == hostname) ++sharing;
  }
  return sharing;
}

}  // namespace zerod::comm::internal
