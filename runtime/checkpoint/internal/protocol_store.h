#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_PROTOCOL_STORE_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_PROTOCOL_STORE_H_

// The job's Store as the save and load protocols use it (save_protocol.h): values that are a
// status or OK with a payload, each call's number and its keys (forgotten once nobody reads them),
// waits that say whom they waited for, and every rank's verdict agreed before a collective.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/store.h"
#include "spdlog/logger.h"

namespace zerod::checkpoint::internal {

// The "checkpoint" logger (stderr unless the process configured one of that name).
spdlog::logger& Log();

// "OK\n<payload>", or "ERR <code>\n<message>" ("ERR <code> damage\n...": IsDamage, which every
// rank must learn alike to decide alike whether to fall back).
std::string EncodeStatus(const absl::Status& status, const std::string& payload = "");
// The payload of an OK value, or the error it carries; INTERNAL naming `key` for anything else.
absl::StatusOr<std::string> DecodeStatus(const std::string& value, const std::string& key);

// Which of this rank's Save/Load calls this is (1, 2, ...): the same on every rank, since every
// rank makes the same calls in the same order.
absl::StatusOr<int64_t> NextCall(comm::Store& store, int64_t rank);

// Lists call `call`'s keys under `ckpt/keys/<call>`, so that a later call can delete them: a job
// that snapshots every step would otherwise fill its store quota (world + 2 keys a save).
absl::Status RememberKeys(comm::Store& store, int64_t call, const std::vector<std::string>& keys);
// Deletes call `call`'s keys. Rank 0 calls it for the previous call once every rank has reached
// this one's rendezvous, so nobody still waits on them. Best effort: a key left costs a little of
// the quota, a failed delete is no reason to fail a save.
void ForgetKeys(comm::Store& store, int64_t call);

// `prefix`0 .. `prefix`<world - 1>.
std::vector<std::string> RankKeys(const std::string& prefix, int64_t world);

// The value at `key`, waited for until `deadline`; a timeout says who was waited for.
absl::StatusOr<std::string> Await(comm::Store& store, const std::string& key, absl::Time deadline,
                                  const std::string& waiting_for, absl::Duration timeout);

// Sets `key` to `value` unless someone set it first; returns what it holds afterwards.
absl::StatusOr<std::string> SetFirst(comm::Store& store, const std::string& key,
                                     const std::string& value);

// Publishes this rank's verdict under `prefix`<rank> and waits for every rank's: the first
// failure (its rank named) on every rank, or OK once all succeeded.
absl::Status Agree(comm::Store& store, const std::string& prefix, int64_t rank, int64_t world,
                   absl::Status mine, absl::Time deadline, absl::Duration timeout,
                   const std::string& what);

// `s` with `context` before its message (its payloads, the damage mark included, kept).
absl::Status Named(const absl::Status& s, const std::string& context);

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_PROTOCOL_STORE_H_
