#ifndef ZEROD_SERVER_STATE_SQLITE_KV_STORE_H_
#define ZEROD_SERVER_STATE_SQLITE_KV_STORE_H_

// The embedded KvStore: one SQLite file in WAL mode, mirrored in memory for reads.
//
// Owns one writer thread. It takes every queued transaction at once, writes them in one SQLite
// transaction (group commit: one fsync for many callers), then publishes them to readers and
// watchers and runs the callbacks. The destructor stops the thread after the queue drains.

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "runtime/common/mutex.h"
#include "server/state/kv_store.h"

struct sqlite3;

namespace zerod::server {

enum class Durability {
  kFull,    // fsync on every commit: nothing committed is lost, power loss included
  kNormal,  // WAL without fsync per commit: survives a process crash, not a power loss
};

class SqliteKvStore final : public KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteKvStore>> Open(const std::string& path,
                                                             Durability durability);
  ~SqliteKvStore() override;
  SqliteKvStore(const SqliteKvStore&) = delete;
  SqliteKvStore& operator=(const SqliteKvStore&) = delete;

  std::optional<KeyValue> Get(const std::string& key) const override;
  std::vector<KeyValue> Range(const std::string& prefix) const override;
  int64_t revision() const override;
  void Commit(std::vector<KvOp> ops, CommitCallback done) override;
  int64_t Watch(const std::string& prefix, WatchCallback callback) override;
  void Unwatch(int64_t id) override;

 private:
  struct Pending {
    std::vector<KvOp> ops;
    CommitCallback done;
  };
  struct Watcher {
    std::string prefix;
    WatchCallback callback;
  };

  explicit SqliteKvStore(sqlite3* db);
  absl::Status Load();
  void WriterLoop();
  void ProcessBatch(std::vector<Pending> batch);
  // Writes one batch's changes in one SQLite transaction; rolls back on any failure.
  absl::Status WriteStaged(const std::map<std::string, std::optional<KeyValue>>& staged,
                           int64_t revision);

  sqlite3* const db_;

  mutable Mutex mu_;
  std::map<std::string, KeyValue> data_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;

  Mutex queue_mu_;
  std::vector<Pending> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  Mutex watch_mu_;
  std::map<int64_t, Watcher> watchers_ ABSL_GUARDED_BY(watch_mu_);
  int64_t next_watch_id_ ABSL_GUARDED_BY(watch_mu_) = 1;

  std::thread writer_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_SQLITE_KV_STORE_H_
