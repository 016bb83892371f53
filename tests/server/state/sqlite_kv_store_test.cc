#include "server/state/sqlite_kv_store.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

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

}  // namespace
}  // namespace zerod::server
