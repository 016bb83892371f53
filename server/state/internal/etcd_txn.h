#ifndef ZEROD_SERVER_STATE_INTERNAL_ETCD_TXN_H_
#define ZEROD_SERVER_STATE_INTERNAL_ETCD_TXN_H_

// One KvStore transaction as one etcd Txn: what must be read first, and, over what was read, the
// results and the conditional Txn that writes them. No I/O here (the store does the calls).
//
// etcd refuses a Txn that writes one key twice or puts a key inside a range it deletes, so the
// ops are first applied to a staged copy and only each key's final state is written; a prefix
// deletion followed by a write under the prefix deletes the prefix's keys one by one instead of
// as a range.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "server/state/kv_store.h"

namespace zerod::server::internal {

// What the ops need read (keys relative to the store's prefix).
struct CommitReads {
  std::set<std::string> keys;      // deletes, adds and compare-and-swaps: their current value
  std::set<std::string> prefixes;  // deleted, then written under: the keys they hold
  bool empty() const { return keys.empty() && prefixes.empty(); }
};
CommitReads ReadsFor(const std::vector<KvOp>& ops);

// What was read, at one revision.
struct CommitSnapshot {
  int64_t revision = 0;
  std::map<std::string, std::pair<std::string, int64_t>> values;  // key -> value, mod_revision
  std::map<std::string, std::vector<std::string>> prefix_keys;    // prefix -> keys under it
};

struct CommitPlan {
  CommitResult result;  // without the revision, which etcd gives
  // The Txn: conditional on everything read being unchanged, and its writes. Empty success ops
  // when there is nothing to write.
  etcdserverpb::TxnRequest txn;
  bool puts = false;  // it puts a key, so a watch on the prefix sees its revision
};

// The ops over `snapshot` (which holds what `reads` asked for), keys stored under `prefix`.
// FAILED_PRECONDITION for an add on a non-integer, OUT_OF_RANGE for one that would overflow, as
// the SQLite store says them: nothing of the transaction is written then.
absl::StatusOr<CommitPlan> PlanCommit(const std::vector<KvOp>& ops, const CommitReads& reads,
                                      const CommitSnapshot& snapshot, const std::string& prefix);

}  // namespace zerod::server::internal

#endif  // ZEROD_SERVER_STATE_INTERNAL_ETCD_TXN_H_
