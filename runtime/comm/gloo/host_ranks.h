#ifndef ZEROD_RUNTIME_COMM_GLOO_HOST_RANKS_H_
#define ZEROD_RUNTIME_COMM_GLOO_HOST_RANKS_H_

// How many ranks of a communicator run on this rank's host, from the addresses their peers reach
// them at (GlooOptions::hostname): ranks that gave the same one share a host. A rendezvous
// through the store that every rank calls, a handful of calls each whatever the world size: each
// adds 1 to its address's counter (`<prefix>host/<XXH3 of the address>`), then to
// `<prefix>arrived`; the rank that brings `arrived` to the world size sets `<prefix>counted`, and
// every rank then reads its address's counter.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/store.h"

namespace zerod::comm::internal {

absl::StatusOr<int64_t> RanksSharingHost(Store& store, const std::string& key_prefix, int64_t world,
                                         const std::string& hostname, absl::Duration timeout);

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_HOST_RANKS_H_
