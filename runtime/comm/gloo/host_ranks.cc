#include "runtime/comm/gloo/host_ranks.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace zerod::comm::internal {

absl::StatusOr<int64_t> RanksSharingHost(Store& store, const std::string& key_prefix, int64_t world,
                                         const std::string& hostname, absl::Duration timeout) {
  if (world <= 1) return world;
  // A hash keeps the key short and free of whatever characters an address has.
  const std::string host_key =
      absl::StrCat(key_prefix, "host/", absl::Hex(XXH3_64bits(hostname.data(), hostname.size())));
  const std::string arrived_key = absl::StrCat(key_prefix, "arrived");
  const std::string counted_key = absl::StrCat(key_prefix, "counted");
  ZEROD_RETURN_IF_ERROR(store.Add(host_key, 1).status());
  // Each rank adds to its host's counter before it arrives, so once all have arrived every
  // counter is final.
  ZEROD_ASSIGN_OR_RETURN(const int64_t arrived, store.Add(arrived_key, 1));
  if (arrived == world) ZEROD_RETURN_IF_ERROR(store.Set(counted_key, "1"));
  if (absl::Status all = store.Wait({counted_key}, timeout); !all.ok()) {
    absl::StatusOr<int64_t> now = store.Add(arrived_key, 0);
    return absl::Status(
        all.code(),
        absl::StrCat(now.ok() ? absl::StrCat(*now) : std::string("not all"), " of ", world,
                     " ranks gave the address their peers reach them at: ", all.message()));
  }
  return store.Add(host_key, 0);
}

}  // namespace zerod::comm::internal
