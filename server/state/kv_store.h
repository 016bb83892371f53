#ifndef ZEROD_SERVER_STATE_KV_STORE_H_
#define ZEROD_SERVER_STATE_KV_STORE_H_

// KvStore: the daemon's durable state behind an etcd-shaped interface: keys with values and
// revisions, transactions of puts, deletes, integer adds and compare-and-swaps, range reads by
// prefix, and watches. SQLite is the embedded backend (sqlite_kv_store.h); an etcd backend can
// implement the same interface without touching the services.
//
// Reads see committed data only. Commit() is asynchronous so that gRPC reactors never wait on the
// disk: `done` runs on the backend's writer thread once the transaction is durable and visible.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zerod::server {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;  // writes since creation
};

struct KvOp {
  enum class Kind { kPut, kDelete, kDeletePrefix, kAdd, kCompareAndSwap };
  Kind kind = Kind::kPut;
  std::string key;  // the prefix for kDeletePrefix
  std::string value;
  int64_t delta = 0;                    // kAdd: the value is decimal text
  std::optional<std::string> expected;  // kCompareAndSwap: nullopt = key must be absent

  static KvOp Put(std::string key, std::string value);
  static KvOp Delete(std::string key);
  static KvOp DeletePrefix(std::string prefix);
  static KvOp Add(std::string key, int64_t delta);
  static KvOp CompareAndSwap(std::string key, std::optional<std::string> expected,
                             std::string desired);
};

// Per op, in order: the value stored afterwards (nullopt when absent), and whether a
// compare-and-swap swapped / a delete deleted.
struct KvOpResult {
  std::optional<std::string> value;
  bool applied = true;
};

struct CommitResult {
  int64_t revision = 0;
  std::vector<KvOpResult> results;
};

// A change seen by a watcher, after commit.
struct KvEvent {
  std::string key;
  std::optional<std::string> value;  // nullopt: deleted
  int64_t revision = 0;
};

// A record whose bytes no longer match the checksum stored with them (changed on disk while the
// daemon was down). Get and Range never serve it; Damaged lists it, so that whoever owns its
// prefix can quarantine it. Writes may overwrite or delete it; an add or compare-and-swap on it
// fails with DATA_LOSS, since its prior value is unknown.
struct DamagedRecord {
  std::string key;
  std::string value;    // as stored: untrusted
  std::string problem;  // "checksum 0x.. stored, 0x.. computed"
};

class KvStore {
 public:
  using CommitCallback = std::function<void(absl::StatusOr<CommitResult>)>;
  using WatchCallback = std::function<void(const std::vector<KvEvent>&)>;

  virtual ~KvStore() = default;

  virtual std::optional<KeyValue> Get(const std::string& key) const = 0;
  virtual std::vector<KeyValue> Range(const std::string& prefix) const = 0;
  virtual int64_t revision() const = 0;
  // The damaged records under `prefix`, in key order.
  virtual std::vector<DamagedRecord> Damaged(const std::string& prefix) const = 0;

  // Applies `ops` atomically and in order. A failing op (an add on a non-integer) fails the whole
  // transaction and nothing is written.
  virtual void Commit(std::vector<KvOp> ops, CommitCallback done) = 0;
  // Commit and wait: for start-up and background threads, never for reactors.
  absl::StatusOr<CommitResult> CommitSync(std::vector<KvOp> ops);

  // Calls `callback` on the writer thread with the committed changes under `prefix`. The
  // callback must not block. Returns an id for Unwatch.
  virtual int64_t Watch(const std::string& prefix, WatchCallback callback) = 0;
  virtual void Unwatch(int64_t id) = 0;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_KV_STORE_H_
