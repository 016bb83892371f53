#include "server/state/sqlite_kv_store.h"

#include <sqlite3.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs SQL on the file behind zerod's back, as damage or an older zerod would have.
void Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << sql << ": " << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

std::unique_ptr<SqliteKvStore> Open(const std::string& dir) {
  auto kv = SqliteKvStore::Open(dir + "/state.db", Durability::kFull);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return *std::move(kv);
}

TEST(SqliteKvStore, PutGetRangeDeleteWithRevisions) {
  testing::TempDir dir;
  auto kv = Open(dir.path());
  auto r1 = kv->CommitSync({KvOp::Put("a/1", "x"), KvOp::Put("a/2", "y"), KvOp::Put("b/1", "z")});
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->revision, 1);
  EXPECT_EQ(kv->Get("a/1")->value, "x");
  EXPECT_EQ(kv->Range("a/").size(), 2u);
  auto r2 = kv->CommitSync({KvOp::Put("a/1", "x2")});
  EXPECT_EQ(r2->revision, 2);
  const KeyValue a1 = *kv->Get("a/1");
  EXPECT_EQ(a1.create_revision, 1);
  EXPECT_EQ(a1.mod_revision, 2);
  EXPECT_EQ(a1.version, 2);
  auto r3 = kv->CommitSync({KvOp::Delete("a/2"), KvOp::Delete("missing")});
  EXPECT_TRUE(r3->results[0].applied);
  EXPECT_FALSE(r3->results[1].applied);
  auto r4 = kv->CommitSync({KvOp::DeletePrefix("a/")});
  EXPECT_TRUE(kv->Range("a/").empty());
  EXPECT_EQ(kv->Range("b/").size(), 1u);
  EXPECT_EQ(kv->revision(), 4);
}

TEST(SqliteKvStore, AddAndCompareAndSwap) {
  testing::TempDir dir;
  auto kv = Open(dir.path());
  EXPECT_EQ(*kv->CommitSync({KvOp::Add("n", 5)})->results[0].value, "5");
  EXPECT_EQ(*kv->CommitSync({KvOp::Add("n", -7)})->results[0].value, "-2");
  auto swapped = kv->CommitSync({KvOp::CompareAndSwap("c", std::nullopt, "v1")});
  EXPECT_TRUE(swapped->results[0].applied);
  auto refused = kv->CommitSync({KvOp::CompareAndSwap("c", std::string("other"), "v2")});
  EXPECT_FALSE(refused->results[0].applied);
  EXPECT_EQ(*refused->results[0].value, "v1");
  EXPECT_EQ(kv->Get("c")->value, "v1");
}

TEST(SqliteKvStore, AFailingOpWritesNothingOfItsTransaction) {
  testing::TempDir dir;
  auto kv = Open(dir.path());
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("text", "hello")}).ok());
  auto failed = kv->CommitSync({KvOp::Put("other", "1"), KvOp::Add("text", 1)});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(kv->Get("other").has_value());
  EXPECT_EQ(kv->revision(), 1);
}

TEST(SqliteKvStore, EverythingCommittedSurvivesReopen) {
  testing::TempDir dir;
  {
    auto kv = Open(dir.path());
    ASSERT_TRUE(
        kv->CommitSync({KvOp::Put("k", std::string("bin\0ary", 7)), KvOp::Add("n", 3)}).ok());
    ASSERT_TRUE(kv->CommitSync({KvOp::Put("k2", "v")}).ok());
  }
  auto kv = Open(dir.path());
  EXPECT_EQ(kv->Get("k")->value, std::string("bin\0ary", 7));
  EXPECT_EQ(kv->Get("n")->value, "3");
  EXPECT_EQ(kv->revision(), 2);
  EXPECT_EQ(kv->CommitSync({KvOp::Put("k3", "")})->revision, 3);
}

TEST(SqliteKvStore, WatchSeesCommittedChangesUnderItsPrefix) {
  testing::TempDir dir;
  auto kv = Open(dir.path());
  std::vector<KvEvent> seen;
  Mutex mu;
  const int64_t id = kv->Watch("jobs/", [&](const std::vector<KvEvent>& events) {
    MutexLock lock(&mu);
    seen.insert(seen.end(), events.begin(), events.end());
  });
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("jobs/a", "1"), KvOp::Put("other", "2")}).ok());
  ASSERT_TRUE(kv->CommitSync({KvOp::Delete("jobs/a")}).ok());
  kv->Unwatch(id);
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("jobs/b", "3")}).ok());
  MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].key, "jobs/a");
  EXPECT_EQ(*seen[0].value, "1");
  EXPECT_FALSE(seen[1].value.has_value());
}

TEST(SqliteKvStore, ConcurrentCommitsAreAllApplied) {
  testing::TempDir dir;
  auto kv = Open(dir.path());
  Mutex mu;
  int done = 0;
  for (int i = 0; i < 500; ++i) {
    kv->Commit({KvOp::Add("counter", 1)}, [&](absl::StatusOr<CommitResult> r) {
      EXPECT_TRUE(r.ok());
      MutexLock lock(&mu);
      ++done;
    });
  }
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == 500; });
  }
  EXPECT_EQ(kv->Get("counter")->value, "500");
}

TEST(SqliteKvStore, UnwritableDirectoryIsAClearError) {
  auto kv = SqliteKvStore::Open("/proc/zerod-cannot/state.db", Durability::kFull);
  ASSERT_FALSE(kv.ok());
  EXPECT_THAT(std::string(kv.status().message()), ::testing::HasSubstr("/proc/zerod-cannot"));
}

TEST(SqliteKvStore, ARecordWhoseBytesChangedOnDiskIsHeldAsideAndNeverServed) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/state.db";
  {
    auto kv = Open(dir.path());
    ASSERT_TRUE(kv->CommitSync({KvOp::Put("a/1", "10.0.0.1:29500"), KvOp::Put("a/2", "kept"),
                                KvOp::Put("n", "7")})
                    .ok());
  }
  // Bytes inside the value change, the stored checksum does not: SQLite's pages stay valid.
  Sql(path, "UPDATE kv SET value = CAST('10.6.6.6:29500' AS BLOB) WHERE key = CAST('a/1' AS BLOB)");
  Sql(path, "UPDATE kv SET checksum = NULL WHERE key = CAST('n' AS BLOB)");
  auto kv = Open(dir.path());
  EXPECT_FALSE(kv->Get("a/1").has_value());
  ASSERT_EQ(kv->Range("a/").size(), 1u);
  EXPECT_EQ(kv->Range("a/")[0].value, "kept");
  const std::vector<DamagedRecord> damaged = kv->Damaged("");
  ASSERT_EQ(damaged.size(), 2u);
  EXPECT_EQ(damaged[0].key, "a/1");
  EXPECT_EQ(damaged[0].value, "10.6.6.6:29500");
  EXPECT_THAT(damaged[0].problem, AllOf(HasSubstr("stored"), HasSubstr("computed")));
  EXPECT_EQ(damaged[1].problem, "no checksum stored");

  // Its prior value is unknown: an add or a compare-and-swap on it is DATA_LOSS naming it.
  auto add = kv->CommitSync({KvOp::Add("n", 1)});
  EXPECT_EQ(add.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(add.status().message(), HasSubstr("key 'n' is damaged"));
  auto swap = kv->CommitSync({KvOp::CompareAndSwap("a/1", std::nullopt, "x")});
  EXPECT_EQ(swap.status().code(), absl::StatusCode::kDataLoss);
  // Overwriting or deleting it is fine, and it is then no longer damaged.
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("a/1", "fresh")}).ok());
  auto deleted = kv->CommitSync({KvOp::Delete("n")});
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(deleted->results[0].applied);
  EXPECT_TRUE(kv->Damaged("").empty());
  kv.reset();
  kv = Open(dir.path());
  EXPECT_EQ(kv->Get("a/1")->value, "fresh");
  EXPECT_FALSE(kv->Get("n").has_value());
  EXPECT_TRUE(kv->Damaged("").empty());
}

TEST(SqliteKvStore, DeletePrefixRemovesDamagedRecordsToo) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_TRUE(Open(dir.path())->CommitSync({KvOp::Put("j/a", "1"), KvOp::Put("j/b", "2")}).ok());
  Sql(path, "UPDATE kv SET value = CAST('9' AS BLOB) WHERE key = CAST('j/a' AS BLOB)");
  {
    auto kv = Open(dir.path());
    ASSERT_EQ(kv->Damaged("j/").size(), 1u);
    ASSERT_TRUE(kv->CommitSync({KvOp::DeletePrefix("j/")}).ok());
    EXPECT_TRUE(kv->Damaged("j/").empty());
  }
  auto kv = Open(dir.path());
  EXPECT_TRUE(kv->Damaged("").empty());
  EXPECT_TRUE(kv->Range("").empty());
}

TEST(SqliteKvStore, ADatabaseFromBeforeChecksumsGetsThemInPlace) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/state.db";
  // The schema zerod wrote before checksums.
  Sql(path,
      "CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, create_rev INTEGER NOT NULL, "
      "mod_rev INTEGER NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID;"
      "CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), revision INTEGER NOT NULL);"
      "INSERT INTO meta VALUES (0, 2);"
      "INSERT INTO kv VALUES (CAST('a' AS BLOB), CAST('old' AS BLOB), 1, 2, 2);");
  {
    auto kv = Open(dir.path());
    EXPECT_EQ(kv->Get("a")->value, "old");
    EXPECT_EQ(kv->revision(), 2);
    EXPECT_TRUE(kv->Damaged("").empty());
  }
  // Sealed: a later change to the old record's bytes is caught.
  Sql(path, "UPDATE kv SET value = CAST('odd' AS BLOB)");
  auto kv = Open(dir.path());
  EXPECT_FALSE(kv->Get("a").has_value());
  EXPECT_EQ(kv->Damaged("").size(), 1u);
}

TEST(SqliteKvStore, AFileThatIsNotADatabaseIsDataLossNamingIt) {
  testing::TempDir dir;
  const std::string path = dir.WriteFile("state.db", std::string(8192, 'x'));
  auto kv = SqliteKvStore::Open(path, Durability::kFull);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(kv.status().message(), HasSubstr("state database " + path + " is damaged"));
}

TEST(SqliteKvStore, ARevisionBehindARecordsIsDataLoss) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_TRUE(Open(dir.path())->CommitSync({KvOp::Put("a", "1")}).ok());
  Sql(path, "UPDATE meta SET revision = 0");
  auto kv = SqliteKvStore::Open(path, Durability::kFull);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(kv.status().message(), HasSubstr("revision 0 is behind a record's revision 1"));
}

// Text over int64's range reads back as INT64_MAX, and the next commit's revision + 1 would
// overflow (found by sqlite_state_fuzz).
TEST(SqliteKvStore, ARevisionThatIsNotACountIsDataLoss) {
  for (const char* stored : {"'99999999999999999999999'", "'seven'", "1.5", "-3"}) {
    testing::TempDir dir;
    const std::string path = dir.path() + "/state.db";
    ASSERT_TRUE(Open(dir.path())->CommitSync({KvOp::Put("a", "1")}).ok());
    Sql(path, std::string("UPDATE meta SET revision = ") + stored);
    auto kv = SqliteKvStore::Open(path, Durability::kFull);
    ASSERT_FALSE(kv.ok()) << stored;
    EXPECT_EQ(kv.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(kv.status().message(), HasSubstr("its revision is not a count")) << stored;
  }
}

TEST(SqliteKvStore, KeepsItsStateIdAndRefusesAFileWithoutStateWhenStateMustExist) {
  testing::TempDir dir;
  std::string id;
  {
    auto kv = Open(dir.path());
    id = kv->state_id();
    EXPECT_EQ(id.size(), 32u);
  }
  EXPECT_EQ(Open(dir.path())->state_id(), id);
  const std::string empty = dir.path() + "/empty.db";
  Sql(empty, "CREATE TABLE unrelated (x)");
  auto refused = SqliteKvStore::Open(empty, SqliteOpenOptions{Durability::kFull, true});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.status().message(), HasSubstr(empty + " holds no zerod state"));
}

}  // namespace
}  // namespace zerod::server
