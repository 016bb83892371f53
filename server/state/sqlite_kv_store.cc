#include "server/state/sqlite_kv_store.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zerod::server {
namespace {

constexpr size_t kMaxBatch = 4096;

absl::Status SqlError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("sqlite ", what, ": ", sqlite3_errmsg(db)));
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite '", sql, "': ", error ? error : "?"));
    sqlite3_free(error);
    return s;
  }
  return absl::OkStatus();
}

using Statement = std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)>;

absl::StatusOr<Statement> Prepare(sqlite3* db, const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db, absl::StrCat("prepare '", sql, "'"));
  }
  return Statement(stmt, &sqlite3_finalize);
}

std::string ColumnBlob(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  return data ? std::string(static_cast<const char*>(data), static_cast<size_t>(size)) : "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteKvStore>> SqliteKvStore::Open(const std::string& path,
                                                                   Durability durability) {
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot open state database ", path, ": ", db ? sqlite3_errmsg(db) : "?"));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SqliteKvStore> store(new SqliteKvStore(db));
  const char* sync =
      durability == Durability::kFull ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL";
  for (const char* sql :
       {"PRAGMA journal_mode=WAL", sync, "PRAGMA busy_timeout=5000",
        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
        "create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL, version INTEGER NOT NULL) "
        "WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), "
        "revision INTEGER NOT NULL)",
        "INSERT OR IGNORE INTO meta (id, revision) VALUES (0, 0)"}) {
    if (absl::Status s = Exec(db, sql); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
    }
  }
  if (absl::Status s = store->Load(); !s.ok()) return s;
  store->writer_ = std::thread([raw = store.get()] { raw->WriterLoop(); });
  return store;
}

SqliteKvStore::SqliteKvStore(sqlite3* db) : db_(db) {}

SqliteKvStore::~SqliteKvStore() {
  {
    MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
  sqlite3_close(db_);
}

absl::Status SqliteKvStore::Load() {
  MutexLock lock(&mu_);
  auto rows = Prepare(db_, "SELECT key, value, create_rev, mod_rev, version FROM kv");
  if (!rows.ok()) return rows.status();
  int rc;
  while ((rc = sqlite3_step(rows->get())) == SQLITE_ROW) {
    KeyValue kv{ColumnBlob(rows->get(), 0), ColumnBlob(rows->get(), 1),
                sqlite3_column_int64(rows->get(), 2), sqlite3_column_int64(rows->get(), 3),
                sqlite3_column_int64(rows->get(), 4)};
    std::string key = kv.key;
    data_.emplace(std::move(key), std::move(kv));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "load");
  auto meta = Prepare(db_, "SELECT revision FROM meta WHERE id = 0");
  if (!meta.ok()) return meta.status();
  if (sqlite3_step(meta->get()) != SQLITE_ROW) return SqlError(db_, "load revision");
  revision_ = sqlite3_column_int64(meta->get(), 0);
  return absl::OkStatus();
}

std::optional<KeyValue> SqliteKvStore::Get(const std::string& key) const {
  MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

std::vector<KeyValue> SqliteKvStore::Range(const std::string& prefix) const {
  MutexLock lock(&mu_);
  std::vector<KeyValue> out;
  for (auto it = data_.lower_bound(prefix);
       it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
    out.push_back(it->second);
  }
  return out;
}

int64_t SqliteKvStore::revision() const {
  MutexLock lock(&mu_);
  return revision_;
}

void SqliteKvStore::Commit(std::vector<KvOp> ops, CommitCallback done) {
  {
    MutexLock lock(&queue_mu_);
    if (!stopping_) {
      queue_.push_back({std::move(ops), std::move(done)});
      return;
    }
  }
  // Outside the lock: `done` may commit again.
  done(absl::UnavailableError("state store is shutting down"));
}

int64_t SqliteKvStore::Watch(const std::string& prefix, WatchCallback callback) {
  MutexLock lock(&watch_mu_);
  const int64_t id = next_watch_id_++;
  watchers_.emplace(id, Watcher{prefix, std::move(callback)});
  return id;
}

void SqliteKvStore::Unwatch(int64_t id) {
  MutexLock lock(&watch_mu_);
  watchers_.erase(id);
}

void SqliteKvStore::WriterLoop() {
  for (;;) {
    std::vector<Pending> batch;
    {
      MutexLock lock(&queue_mu_);
      queue_mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return stopping_ || !queue_.empty();
      });
      if (queue_.empty()) return;  // stopping, and everything queued was written
      const size_t n = std::min(queue_.size(), kMaxBatch);
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.begin() + static_cast<long>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(n));
    }
    ProcessBatch(std::move(batch));
  }
}

absl::Status SqliteKvStore::WriteStaged(
    const std::map<std::string, std::optional<KeyValue>>& staged, int64_t revision) {
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    auto put = Prepare(db_,
                       "INSERT OR REPLACE INTO kv (key, value, create_rev, mod_rev, version) "
                       "VALUES (?, ?, ?, ?, ?)");
    auto del = Prepare(db_, "DELETE FROM kv WHERE key = ?");
    auto meta = Prepare(db_, "UPDATE meta SET revision = ? WHERE id = 0");
    if (!put.ok()) return put.status();
    if (!del.ok()) return del.status();
    if (!meta.ok()) return meta.status();
    for (const auto& [key, entry] : staged) {
      sqlite3_stmt* stmt = entry ? put->get() : del->get();
      sqlite3_reset(stmt);
      sqlite3_bind_blob(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
      if (entry) {
        sqlite3_bind_blob(stmt, 2, entry->value.data(), static_cast<int>(entry->value.size()),
                          SQLITE_STATIC);
        sqlite3_bind_int64(stmt, 3, entry->create_revision);
        sqlite3_bind_int64(stmt, 4, entry->mod_revision);
        sqlite3_bind_int64(stmt, 5, entry->version);
      }
      if (sqlite3_step(stmt) != SQLITE_DONE) return SqlError(db_, "write");
    }
    sqlite3_bind_int64(meta->get(), 1, revision);
    if (sqlite3_step(meta->get()) != SQLITE_DONE) return SqlError(db_, "write revision");
    return absl::OkStatus();
  }();
  if (status.ok() && sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    status = SqlError(db_, "commit");
  }
  // Nothing of a failed batch may stay behind.
  if (!status.ok()) Exec(db_, "ROLLBACK").IgnoreError();
  return status;
}

void SqliteKvStore::ProcessBatch(std::vector<Pending> batch) {
  // Staged view of this batch over the committed data: key -> entry (nullopt: deleted).
  std::map<std::string, std::optional<KeyValue>> staged;
  std::vector<absl::StatusOr<CommitResult>> outcomes;
  std::vector<KvEvent> events;
  int64_t revision = this->revision();

  auto lookup = [&](const std::map<std::string, std::optional<KeyValue>>& overlay,
                    const std::string& key) -> std::optional<KeyValue> {
    if (auto it = overlay.find(key); it != overlay.end()) return it->second;
    if (auto it = staged.find(key); it != staged.end()) return it->second;
    return Get(key);
  };

  for (Pending& p : batch) {
    std::map<std::string, std::optional<KeyValue>> txn;
    CommitResult result;
    result.revision = revision + 1;
    absl::Status failed;
    auto write = [&](const std::string& key, std::optional<std::string> value) {
      std::optional<KeyValue> prior = lookup(txn, key);
      if (!value) {
        txn[key] = std::nullopt;
        return;
      }
      KeyValue kv{key, std::move(*value), prior ? prior->create_revision : result.revision,
                  result.revision, prior ? prior->version + 1 : 1};
      txn[key] = std::move(kv);
    };
    for (const KvOp& op : p.ops) {
      KvOpResult r;
      switch (op.kind) {
        case KvOp::Kind::kPut:
          write(op.key, op.value);
          r.value = op.value;
          break;
        case KvOp::Kind::kDelete:
          r.applied = lookup(txn, op.key).has_value();
          if (r.applied) write(op.key, std::nullopt);
          break;
        case KvOp::Kind::kDeletePrefix: {
          std::vector<std::string> keys;
          for (const KeyValue& kv : Range(op.key)) keys.push_back(kv.key);
          for (const auto* overlay : {&staged, &txn}) {
            for (auto it = overlay->lower_bound(op.key);
                 it != overlay->end() && absl::StartsWith(it->first, op.key); ++it) {
              keys.push_back(it->first);
            }
          }
          for (const std::string& k : keys) {
            if (lookup(txn, k)) write(k, std::nullopt);
          }
          break;
        }
        case KvOp::Kind::kAdd: {
          int64_t value = 0;
          if (std::optional<KeyValue> prior = lookup(txn, op.key)) {
            if (!absl::SimpleAtoi(prior->value, &value)) {
              failed = absl::FailedPreconditionError(absl::StrCat(
                  "key '", op.key, "' holds '", prior->value.substr(0, 32), "', not an integer"));
            }
          }
          if (failed.ok() && __builtin_add_overflow(value, op.delta, &value)) {
            // Wrapping would hand out a counter value already given (or a negative one).
            failed = absl::OutOfRangeError(absl::StrCat("key '", op.key, "': adding ", op.delta,
                                                        " would overflow a 64-bit integer"));
          }
          r.value = absl::StrCat(value);
          if (failed.ok()) write(op.key, r.value);
          break;
        }
        case KvOp::Kind::kCompareAndSwap: {
          std::optional<KeyValue> prior = lookup(txn, op.key);
          r.applied = op.expected ? (prior && prior->value == *op.expected) : !prior;
          if (r.applied) {
            write(op.key, op.value);
            r.value = op.value;
          } else if (prior) {
            r.value = prior->value;
          }
          break;
        }
      }
      if (!failed.ok()) break;
      result.results.push_back(std::move(r));
    }
    if (!failed.ok()) {
      outcomes.push_back(failed);
      continue;
    }
    if (!txn.empty()) {
      ++revision;
      for (auto& [key, entry] : txn) {
        events.push_back(
            {key, entry ? std::optional<std::string>(entry->value) : std::nullopt, revision});
        staged[key] = std::move(entry);
      }
    } else {
      result.revision = revision;
    }
    outcomes.push_back(std::move(result));
  }

  const absl::Status written = staged.empty() ? absl::OkStatus() : WriteStaged(staged, revision);

  if (written.ok() && !staged.empty()) {
    {
      MutexLock lock(&mu_);
      for (auto& [key, entry] : staged) {
        if (entry) {
          data_[key] = std::move(*entry);
        } else {
          data_.erase(key);
        }
      }
      revision_ = revision;
    }
    MutexLock lock(&watch_mu_);
    for (const auto& [id, watcher] : watchers_) {
      std::vector<KvEvent> mine;
      for (const KvEvent& e : events) {
        if (absl::StartsWith(e.key, watcher.prefix)) mine.push_back(e);
      }
      if (!mine.empty()) watcher.callback(mine);
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!written.ok() && outcomes[i].ok()) {
      batch[i].done(written);
    } else {
      batch[i].done(std::move(outcomes[i]));
    }
  }
}

}  // namespace zerod::server
