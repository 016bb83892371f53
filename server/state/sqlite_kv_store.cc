#include "server/state/sqlite_kv_store.h"

#include <errno.h>
#include <sqlite3.h>

#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/logging.h"
#include "server/metrics/server_metrics.h"
#include "server/state/record_checksum.h"

namespace zerod::server {
namespace {

// At most 32 bytes of a damaged text value, for a message.
std::string ShownText(const char* text) {
  const std::string t = text == nullptr ? "" : text;
  return t.size() > 32 ? absl::StrCat(t.substr(0, 32), "...") : t;
}

constexpr size_t kMaxBatch = 4096;
// integrity_check lists at most this many problems: the first ones say what broke.
constexpr int kProblemsShown = 3;
// Damaged records named one by one in the log; a file damaged throughout gets a count after them.
constexpr size_t kDamagedNamedInLog = 16;

using Statement = std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)>;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status SqlStatus(sqlite3* db, const std::string& path, absl::string_view what) {
  const int code = sqlite3_extended_errcode(db);
  const std::string detail = absl::StrCat(what, ": ", sqlite3_errmsg(db));
  const bool full = (code & 0xff) == SQLITE_FULL ||
                    ((code & 0xff) == SQLITE_IOERR && sqlite3_system_errno(db) == ENOSPC);
  if (full) {
    return absl::ResourceExhaustedError(absl::StrCat("state database ", path, ": no space left in ",
                                                     DirOf(path), " (", detail,
                                                     "); nothing of this write was stored"));
  }
  if ((code & 0xff) == SQLITE_CORRUPT || (code & 0xff) == SQLITE_NOTADB) {
    return absl::DataLossError(absl::StrCat("state database ", path, " is damaged (", detail, ")"));
  }
  return absl::InternalError(absl::StrCat("state database ", path, ": sqlite ", detail));
}

absl::StatusOr<Statement> Prepare(sqlite3* db, const std::string& path, const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlStatus(db, path, absl::StrCat("prepare '", sql, "'"));
  }
  return Statement(stmt, &sqlite3_finalize);
}

std::string ColumnBlob(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  return data ? std::string(static_cast<const char*>(data), static_cast<size_t>(size)) : "";
}

// zerod_record_checksum(key, value, create_rev, mod_rev, version), for the in-place upgrade.
void ChecksumFunction(sqlite3_context* context, int, sqlite3_value** args) {
  auto bytes = [](sqlite3_value* v) {
    const void* data = sqlite3_value_blob(v);
    const int size = sqlite3_value_bytes(v);
    return data ? std::string(static_cast<const char*>(data), static_cast<size_t>(size)) : "";
  };
  const KeyValue kv{bytes(args[0]), bytes(args[1]), sqlite3_value_int64(args[2]),
                    sqlite3_value_int64(args[3]), sqlite3_value_int64(args[4])};
  sqlite3_result_int64(context, static_cast<int64_t>(RecordChecksum(kv)));
}

std::string NewStateId() {
  std::random_device random;  // /dev/urandom
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&id, "%08x", random());
  return id;
}

}  // namespace

absl::Status SqliteKvStore::SqlError(absl::string_view what) const {
  return SqlStatus(db_, path_, what);
}

absl::StatusOr<std::unique_ptr<SqliteKvStore>> SqliteKvStore::Open(const std::string& path,
                                                                   Durability durability) {
  return Open(path, SqliteOpenOptions{durability, false});
}

absl::StatusOr<std::unique_ptr<SqliteKvStore>> SqliteKvStore::Open(
    const std::string& path, const SqliteOpenOptions& options) {
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX |
                    (options.must_hold_state ? 0 : SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot open state database ", path, ": ", db ? sqlite3_errmsg(db) : "?"));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SqliteKvStore> store(new SqliteKvStore(db, path));
  if (absl::Status s = store->PrepareSchema(options.must_hold_state); !s.ok()) return s;
  const char* sync = options.durability == Durability::kFull ? "PRAGMA synchronous=FULL"
                                                             : "PRAGMA synchronous=NORMAL";
  for (const char* sql : {sync, "PRAGMA busy_timeout=5000"}) {
    if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      return store->SqlError(sql);
    }
  }
  if (absl::Status s = store->Load(); !s.ok()) return s;
  store->writer_ = std::thread([raw = store.get()] { raw->WriterLoop(); });
  return store;
}

SqliteKvStore::SqliteKvStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

SqliteKvStore::~SqliteKvStore() {
  {
    MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
  sqlite3_close(db_);
}

absl::Status SqliteKvStore::PrepareSchema(bool must_hold_state) {
  // Every page is checked before anything is read or written. Over 1M records (270 MB),
  // integrity_check took 0.4-0.5 s warm, as quick_check did: the kv table is its own index
  // (WITHOUT ROWID), so the index cross-checks quick_check leaves out cost nothing here.
  {
    auto check =
        Prepare(db_, path_, "PRAGMA integrity_check(" + std::to_string(kProblemsShown) + ")");
    if (!check.ok()) return check.status();
    std::vector<std::string> problems;
    int rc;
    while ((rc = sqlite3_step(check->get())) == SQLITE_ROW) {
      std::string line = ColumnBlob(check->get(), 0);
      if (line != "ok") problems.push_back(std::move(line));
    }
    if (rc != SQLITE_DONE) return SqlError("integrity_check");
    if (!problems.empty()) {
      return absl::DataLossError(
          absl::StrCat("state database ", path_,
                       " is damaged (integrity_check: ", absl::StrJoin(problems, "; "), ")"));
    }
  }
  bool has_kv = false;
  {  // finalized before the schema changes: an open statement holds a read transaction
    auto tables = Prepare(
        db_, path_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'kv'");
    if (!tables.ok()) return tables.status();
    if (sqlite3_step(tables->get()) != SQLITE_ROW) return SqlError("read schema");
    has_kv = sqlite3_column_int64(tables->get(), 0) > 0;
  }
  if (!has_kv && must_hold_state) {
    return absl::DataLossError(
        absl::StrCat("state database ", path_, " holds no zerod state (it has no kv table)"));
  }
  for (const char* sql :
       {"PRAGMA journal_mode=WAL",
        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
        "create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL, version INTEGER NOT NULL, "
        "checksum INTEGER) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), "
        "revision INTEGER NOT NULL)",
        "INSERT OR IGNORE INTO meta (id, revision) VALUES (0, 0)",
        "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)"}) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return SqlError(sql);
  }
  if (absl::Status s = AddChecksums(); !s.ok()) return s;

  auto id = Prepare(db_, path_, "SELECT value FROM settings WHERE name = 'state_id'");
  if (!id.ok()) return id.status();
  const int rc = sqlite3_step(id->get());
  if (rc == SQLITE_ROW) {
    state_id_ = ColumnBlob(id->get(), 0);
    return absl::OkStatus();
  }
  if (rc != SQLITE_DONE) return SqlError("read state id");
  if (must_hold_state) {
    return absl::DataLossError(absl::StrCat("state database ", path_,
                                            " holds no state id: it is not the state kept here"));
  }
  state_id_ = NewStateId();
  auto put = Prepare(db_, path_, "INSERT INTO settings (name, value) VALUES ('state_id', ?)");
  if (!put.ok()) return put.status();
  sqlite3_bind_text(put->get(), 1, state_id_.data(), static_cast<int>(state_id_.size()),
                    SQLITE_STATIC);
  if (sqlite3_step(put->get()) != SQLITE_DONE) return SqlError("write state id");
  return absl::OkStatus();
}

absl::Status SqliteKvStore::AddChecksums() {
  {  // finalized before the upgrade
    auto columns =
        Prepare(db_, path_, "SELECT count(*) FROM pragma_table_info('kv') WHERE name = 'checksum'");
    if (!columns.ok()) return columns.status();
    if (sqlite3_step(columns->get()) != SQLITE_ROW) return SqlError("read schema");
    if (sqlite3_column_int64(columns->get(), 0) > 0) return absl::OkStatus();
  }
  // A database from before checksums: its records are taken as they are (integrity_check has
  // passed) and sealed in one transaction, so a crash leaves either no column or every sum.
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqlError("begin upgrade");
  }
  absl::Status status = [&]() -> absl::Status {
    if (sqlite3_exec(db_, "ALTER TABLE kv ADD COLUMN checksum INTEGER", nullptr, nullptr,
                     nullptr) != SQLITE_OK) {
      return SqlError("add checksum column");
    }
    // Computed inside SQLite, row by row, so the sums cover exactly the bytes that Load reads.
    if (sqlite3_create_function_v2(db_, "zerod_record_checksum", 5,
                                   SQLITE_UTF8 | SQLITE_DETERMINISTIC, nullptr, &ChecksumFunction,
                                   nullptr, nullptr, nullptr) != SQLITE_OK) {
      return SqlError("register checksum function");
    }
    if (sqlite3_exec(db_,
                     "UPDATE kv SET checksum = zerod_record_checksum(key, value, create_rev, "
                     "mod_rev, version)",
                     nullptr, nullptr, nullptr) != SQLITE_OK) {
      return SqlError("write checksums");
    }
    const int64_t sealed = sqlite3_changes64(db_);
    Logger("state")->info("state database {}: added checksums to {} record(s) written before them",
                          path_, sealed);
    return absl::OkStatus();
  }();
  if (status.ok() && sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    status = SqlError("commit upgrade");
  }
  if (!status.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return status;
}

absl::Status SqliteKvStore::Load() {
  MutexLock lock(&mu_);
  auto rows =
      Prepare(db_, path_, "SELECT key, value, create_rev, mod_rev, version, checksum FROM kv");
  if (!rows.ok()) return rows.status();
  int64_t newest = 0;
  int rc;
  while ((rc = sqlite3_step(rows->get())) == SQLITE_ROW) {
    KeyValue kv{ColumnBlob(rows->get(), 0), ColumnBlob(rows->get(), 1),
                sqlite3_column_int64(rows->get(), 2), sqlite3_column_int64(rows->get(), 3),
                sqlite3_column_int64(rows->get(), 4)};
    const uint64_t computed = RecordChecksum(kv);
    const bool has_sum = sqlite3_column_type(rows->get(), 5) != SQLITE_NULL;
    const auto stored = static_cast<uint64_t>(sqlite3_column_int64(rows->get(), 5));
    if (!has_sum || stored != computed) {
      std::string problem =
          has_sum ? absl::StrFormat("checksum %016x stored, %016x computed", stored, computed)
                  : "no checksum stored";
      if (damaged_.size() < kDamagedNamedInLog) {
        Logger("state")->error("state database {}: record '{}' is damaged ({}); it is not served",
                               path_, absl::CHexEscape(kv.key.substr(0, 256)), problem);
      }
      std::string key = kv.key;
      damaged_.emplace(std::move(key),
                       DamagedRecord{kv.key, std::move(kv.value), std::move(problem)});
      continue;
    }
    newest = std::max(newest, kv.mod_revision);
    std::string key = kv.key;
    data_.emplace(std::move(key), std::move(kv));
  }
  if (rc != SQLITE_DONE) return SqlError("load");
  if (damaged_.size() > kDamagedNamedInLog) {
    Logger("state")->error("state database {}: {} damaged records in all, none of them served",
                           path_, damaged_.size());
  }
  auto meta = Prepare(db_, path_, "SELECT revision FROM meta WHERE id = 0");
  if (!meta.ok()) return meta.status();
  if (sqlite3_step(meta->get()) != SQLITE_ROW) return SqlError("load revision");
  // Stored as text or a real, or past 2^62, it is damage: SQLite would read text over int64's
  // range as INT64_MAX, and the next commit's revision + 1 would overflow.
  if (sqlite3_column_type(meta->get(), 0) != SQLITE_INTEGER ||
      sqlite3_column_int64(meta->get(), 0) < 0 ||
      sqlite3_column_int64(meta->get(), 0) > (int64_t{1} << 62)) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path_, " is damaged (its revision is not a count: '",
        ShownText(reinterpret_cast<const char*>(sqlite3_column_text(meta->get(), 0))), "')"));
  }
  revision_ = sqlite3_column_int64(meta->get(), 0);
  // A revision behind a record's would be handed out twice.
  if (revision_ < newest) {
    return absl::DataLossError(absl::StrCat("state database ", path_, " is damaged (revision ",
                                            revision_, " is behind a record's revision ", newest,
                                            ")"));
  }
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
  return RangeOfMirror(data_, prefix);
}

int64_t SqliteKvStore::revision() const {
  MutexLock lock(&mu_);
  return revision_;
}

std::vector<DamagedRecord> SqliteKvStore::Damaged(const std::string& prefix) const {
  MutexLock lock(&mu_);
  std::vector<DamagedRecord> out;
  for (auto it = damaged_.lower_bound(prefix);
       it != damaged_.end() && absl::StartsWith(it->first, prefix); ++it) {
    out.push_back(it->second);
  }
  return out;
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
  return watchers_.Add(prefix, std::move(callback));
}

void SqliteKvStore::Unwatch(int64_t id) { watchers_.Remove(id); }

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
  const absl::Time start = absl::Now();
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqlError("begin");
  }
  absl::Status status = [&]() -> absl::Status {
    auto put = Prepare(db_, path_,
                       "INSERT OR REPLACE INTO kv (key, value, create_rev, mod_rev, version, "
                       "checksum) VALUES (?, ?, ?, ?, ?, ?)");
    auto del = Prepare(db_, path_, "DELETE FROM kv WHERE key = ?");
    auto meta = Prepare(db_, path_, "UPDATE meta SET revision = ? WHERE id = 0");
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
        sqlite3_bind_int64(stmt, 6, static_cast<int64_t>(RecordChecksum(*entry)));
      }
      if (sqlite3_step(stmt) != SQLITE_DONE) return SqlError("write");
    }
    sqlite3_bind_int64(meta->get(), 1, revision);
    if (sqlite3_step(meta->get()) != SQLITE_DONE) return SqlError("write revision");
    return absl::OkStatus();
  }();
  if (status.ok() && sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    status = SqlError("commit");
  }
  // Nothing of a failed batch may stay behind.
  if (!status.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  metrics::Metrics().sqlite_commit_seconds.WithLabels({})->Observe(absl::Now() - start);
  return status;
}

void SqliteKvStore::NoteWriteOutcome(const absl::Status& written) {
  const bool full = written.code() == absl::StatusCode::kResourceExhausted;
  if (full && !disk_full_) {
    Logger("state")->error("{}; writes fail until space is freed, reads go on",
                           std::string(written.message()));
  } else if (!written.ok() && !full) {
    Logger("state")->error("{}", std::string(written.message()));
  } else if (written.ok() && disk_full_) {
    Logger("state")->info("state database {}: writes succeed again", path_);
  }
  disk_full_ = full;
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
  // A damaged record is neither present (its value is unknown) nor absent (it is on disk).
  auto damaged = [&](const std::map<std::string, std::optional<KeyValue>>& overlay,
                     const std::string& key) {
    if (overlay.count(key) > 0 || staged.count(key) > 0) return false;
    MutexLock lock(&mu_);
    return damaged_.count(key) > 0;
  };
  auto damaged_error = [](const std::string& key) {
    return absl::DataLossError(absl::StrCat("key '", key.substr(0, 128),
                                            "' is damaged on disk; it can only be overwritten or "
                                            "deleted"));
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
          r.applied = lookup(txn, op.key).has_value() || damaged(txn, op.key);
          if (r.applied) write(op.key, std::nullopt);
          break;
        case KvOp::Kind::kDeletePrefix: {
          std::vector<std::string> keys;
          for (const KeyValue& kv : Range(op.key)) keys.push_back(kv.key);
          for (const DamagedRecord& d : Damaged(op.key)) keys.push_back(d.key);
          for (const auto* overlay : {&staged, &txn}) {
            for (auto it = overlay->lower_bound(op.key);
                 it != overlay->end() && absl::StartsWith(it->first, op.key); ++it) {
              keys.push_back(it->first);
            }
          }
          for (const std::string& k : keys) {
            if (lookup(txn, k) || damaged(txn, k)) write(k, std::nullopt);
          }
          break;
        }
        case KvOp::Kind::kAdd: {
          int64_t value = 0;
          if (damaged(txn, op.key)) {
            failed = damaged_error(op.key);
          } else if (std::optional<KeyValue> prior = lookup(txn, op.key)) {
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
          if (damaged(txn, op.key)) {
            failed = damaged_error(op.key);
            break;
          }
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
  if (!staged.empty()) NoteWriteOutcome(written);

  if (written.ok() && !staged.empty()) {
    {
      MutexLock lock(&mu_);
      for (auto& [key, entry] : staged) {
        damaged_.erase(key);
        if (entry) {
          data_[key] = std::move(*entry);
        } else {
          data_.erase(key);
        }
      }
      revision_ = revision;
    }
    watchers_.Deliver(events);
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
