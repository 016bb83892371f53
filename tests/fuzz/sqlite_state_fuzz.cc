// The daemon's start-up read path on a state file whose rows are fuzzed: SqliteKvStore::Open loads
// the rows, JobRegistry::Recover decodes every job from them, and one commit (a put and an add)
// goes on top, as the first request after a restart would. The input is a list of strings
// (fuzz_records.h): first the meta table's columns other than its id, then rows of the kv table,
// one string per column. Columns are learnt from the file the real Open creates, so a change of
// schema needs no change here; text bound to an INTEGER column is stored as SQLite's affinity
// rules say (a number, or the text itself when it is not one).

#include <fuzzer/FuzzedDataProvider.h>
#include <sqlite3.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/clock.h"
#include "server/job_registry.h"
#include "server/logging.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/fuzz/fuzz_records.h"
#include "tests/fuzz/quiet_logs.h"

namespace {

namespace fs = std::filesystem;
using zerod::server::SqliteKvStore;

constexpr int kMaxRows = 32;

struct Column {
  std::string name;
  bool blob = false;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "sqlite_state_fuzz: %s failed\n", what);
    std::abort();
  }
}

std::vector<Column> Columns(sqlite3* db, const std::string& table) {
  sqlite3_stmt* stmt = nullptr;
  Check(sqlite3_prepare_v2(db, ("PRAGMA table_info(" + table + ")").c_str(), -1, &stmt, nullptr) ==
            SQLITE_OK,
        "table_info");
  std::vector<Column> columns;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    const std::string name = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 1));
    const std::string type = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 2));
    columns.push_back({name, absl::StrContains(type, "BLOB")});
  }
  sqlite3_finalize(stmt);
  return columns;
}

// The file as SqliteKvStore::Open creates it, and its columns: made once per process.
struct Template {
  std::string dir;
  std::string path;
  std::string bytes;
  std::vector<Column> kv_columns;
  std::vector<Column> meta_columns;  // without the id
};

const Template& GetTemplate() {
  static const Template* t = [] {
    auto* t = new Template;
    t->dir = zerod::fuzz::ScratchDir("zerod-sqlite-fuzz").string();
    t->path = t->dir + "/zerod.db";
    {
      auto kv = SqliteKvStore::Open(t->path, zerod::server::Durability::kNormal);
      Check(kv.ok(), "creating the template state file");
    }
    std::ifstream in(t->path, std::ios::binary);
    t->bytes.assign(std::istreambuf_iterator<char>(in), {});
    sqlite3* db = nullptr;
    Check(sqlite3_open(t->path.c_str(), &db) == SQLITE_OK, "opening the template");
    t->kv_columns = Columns(db, "kv");
    for (Column& c : Columns(db, "meta")) {
      if (c.name != "id") t->meta_columns.push_back(std::move(c));
    }
    sqlite3_close(db);
    return t;
  }();
  return *t;
}

void Bind(sqlite3_stmt* stmt, int index, const Column& column, const std::string& value) {
  if (column.blob) {
    sqlite3_bind_blob(stmt, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  } else {
    sqlite3_bind_text(stmt, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  }
}

std::vector<std::string> Names(const std::vector<Column>& columns) {
  std::vector<std::string> names;
  for (const Column& c : columns) names.push_back(c.name);
  return names;
}

// Writes the fuzzed rows into a fresh copy of the template.
void WriteState(const Template& t, FuzzedDataProvider& in) {
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(t.path + suffix);
  {
    std::ofstream out(t.path, std::ios::binary);
    out << t.bytes;
  }
  sqlite3* db = nullptr;
  Check(sqlite3_open(t.path.c_str(), &db) == SQLITE_OK, "opening the copy");
  sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
  sqlite3_stmt* stmt = nullptr;
  if (!t.meta_columns.empty()) {
    const std::string sql =
        absl::StrCat("UPDATE meta SET ", absl::StrJoin(Names(t.meta_columns), " = ?, "), " = ?");
    Check(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK, "update meta");
    for (size_t i = 0; i < t.meta_columns.size(); ++i) {
      Bind(stmt, static_cast<int>(i + 1), t.meta_columns[i], in.ConsumeRandomLengthString(32));
    }
    sqlite3_step(stmt);  // a constraint may refuse the values: then the template's stay
    sqlite3_finalize(stmt);
  }
  const std::string sql = absl::StrCat(
      "INSERT OR REPLACE INTO kv (", absl::StrJoin(Names(t.kv_columns), ", "), ") VALUES (",
      absl::StrJoin(std::vector<std::string>(t.kv_columns.size(), "?"), ", "), ")");
  Check(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK, "insert kv");
  for (int row = 0; row < kMaxRows && in.remaining_bytes() > 0; ++row) {
    sqlite3_reset(stmt);
    for (size_t i = 0; i < t.kv_columns.size(); ++i) {
      Bind(stmt, static_cast<int>(i + 1), t.kv_columns[i],
           in.ConsumeRandomLengthString(zerod::fuzz::kMaxRecordBytes));
    }
    sqlite3_step(stmt);
  }
  sqlite3_finalize(stmt);
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  Check(sqlite3_close(db) == SQLITE_OK, "closing the copy");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zerod::fuzz::QuietProtobufLogs();
  zerod::server::SetLogLevel("off");  // every damaged row is logged as it is quarantined
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Template& t = GetTemplate();
  FuzzedDataProvider in(data, size);
  WriteState(t, in);

  auto kv = SqliteKvStore::Open(t.path, zerod::server::Durability::kNormal);
  if (!kv.ok()) return 0;
  static const zerod::server::RealClock clock;
  {
    zerod::server::JobRegistry registry(kv->get(), &clock, {});
    if (registry.Recover().ok()) (void)registry.ListJobs();
  }
  const std::vector<zerod::server::KeyValue> rows = (*kv)->Range("");
  const std::string key = rows.empty() ? "jobs/fuzz/kv/k" : rows.front().key;
  const int64_t before = (*kv)->revision();
  auto committed = (*kv)->CommitSync(
      {zerod::server::KvOp::Put("jobs/fuzz/kv/new", "v"), zerod::server::KvOp::Add(key, 1)});
  if (committed.ok() && committed->revision <= before) {
    fprintf(stderr, "revision went from %lld to %lld\n", static_cast<long long>(before),
            static_cast<long long>(committed->revision));
    std::abort();
  }
  return 0;
}
