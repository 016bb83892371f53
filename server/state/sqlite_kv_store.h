#ifndef ZEROD_SERVER_STATE_SQLITE_KV_STORE_H_
#define ZEROD_SERVER_STATE_SQLITE_KV_STORE_H_

// The embedded KvStore: one SQLite file in WAL mode, mirrored in memory for reads.
//
// Open checks the file before anything is served: SQLite's integrity_check over every page, then
// each record against its checksum (record_checksum.h) as it is loaded; a damaged page is
// DATA_LOSS naming the file, a damaged record is held aside (KvStore::Damaged). A database from
// before checksums gets them in place. The file carries a random state id, so that the data
// dir's marker (state_dir.h) can tell it from another, or from a new empty one. A write that
// fails for lack of space is RESOURCE_EXHAUSTED naming the data dir, logged once until a write
// succeeds again; nothing of it is applied.
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
#include "absl/strings/string_view.h"
#include "runtime/common/mutex.h"
#include "server/state/kv_store.h"
#include "server/state/kv_watchers.h"

struct sqlite3;

namespace zerod::server {

enum class Durability {
  kFull,    // fsync on every commit: nothing committed is lost, power loss included
  kNormal,  // WAL without fsync per commit: survives a process crash, not a power loss
};

struct SqliteOpenOptions {
  Durability durability = Durability::kFull;
  // State is known to exist here: a file without zerod's tables is refused, not initialized.
  bool must_hold_state = false;
};

class SqliteKvStore final : public KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteKvStore>> Open(const std::string& path,
                                                             Durability durability);
  static absl::StatusOr<std::unique_ptr<SqliteKvStore>> Open(const std::string& path,
                                                             const SqliteOpenOptions& options);
  ~SqliteKvStore() override;
  SqliteKvStore(const SqliteKvStore&) = delete;
  SqliteKvStore& operator=(const SqliteKvStore&) = delete;

  std::optional<KeyValue> Get(const std::string& key) const override;
  std::vector<KeyValue> Range(const std::string& prefix) const override;
  int64_t revision() const override;
  std::vector<DamagedRecord> Damaged(const std::string& prefix) const override;
  void Commit(std::vector<KvOp> ops, CommitCallback done) override;
  int64_t Watch(const std::string& prefix, WatchCallback callback) override;
  void Unwatch(int64_t id) override;

  // Identifies this state; made when the file is first initialized.
  const std::string& state_id() const { return state_id_; }

 private:
  struct Pending {
    std::vector<KvOp> ops;
    CommitCallback done;
  };

  SqliteKvStore(sqlite3* db, std::string path);
  // Creates the tables (or refuses a file without them), adds checksums to a database from
  // before them, and reads or makes the state id.
  absl::Status PrepareSchema(bool must_hold_state);
  absl::Status AddChecksums();
  absl::Status Load();
  void WriterLoop();
  void ProcessBatch(std::vector<Pending> batch);
  // Writes one batch's changes in one SQLite transaction; rolls back on any failure.
  absl::Status WriteStaged(const std::map<std::string, std::optional<KeyValue>>& staged,
                           int64_t revision);

  // An error of SQLite's as a status naming the file: DATA_LOSS for a damaged file,
  // RESOURCE_EXHAUSTED for a full disk, INTERNAL otherwise.
  absl::Status SqlError(absl::string_view what) const;
  // Logs the start and the end of a run of writes failing for lack of space, once each.
  void NoteWriteOutcome(const absl::Status& written);

  sqlite3* const db_;
  const std::string path_;
  std::string state_id_;
  bool disk_full_ = false;  // writer thread only

  mutable Mutex mu_;
  std::map<std::string, KeyValue> data_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, DamagedRecord> damaged_ ABSL_GUARDED_BY(mu_);

  Mutex queue_mu_;
  std::vector<Pending> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  KvWatchers watchers_;

  std::thread writer_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_SQLITE_KV_STORE_H_
