// StoreQuota on a real SQLite store: what each job's store holds, learnt from commits of every
// kind, and room reserved by writes in flight.

#include "server/store_quota.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;

class StoreQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = *SqliteKvStore::Open(dir_.path() + "/state.db", Durability::kNormal);
  }
  void Commit(std::vector<KvOp> ops) { ASSERT_TRUE(kv_->CommitSync(std::move(ops)).ok()); }

  testing::TempDir dir_;
  std::unique_ptr<SqliteKvStore> kv_;
};

TEST_F(StoreQuotaTest, CountsKeysAndBytesOfEachJobsStoreOnlyFromCommits) {
  Commit({KvOp::Put("jobs/a/kv/x", "12345"), KvOp::Put("jobs/a/meta", "not a store key")});
  StoreQuota quota(kv_.get(), 10, 1000);
  EXPECT_EQ(quota.keys("a"), 1);
  EXPECT_EQ(quota.bytes("a"), 6);  // "x" and "12345"
  Commit({KvOp::Put("jobs/a/kv/dir/y", "1"), KvOp::Put("jobs/b/kv/x", "1"),
          KvOp::Put("jobs/a/kv/x", "1")});
  EXPECT_EQ(quota.keys("a"), 2);
  EXPECT_EQ(quota.bytes("a"), 2 + 6);
  EXPECT_EQ(quota.keys("b"), 1);
  // A job's end deletes its store by prefix: every key goes.
  Commit({KvOp::DeletePrefix("jobs/a/kv/")});
  EXPECT_EQ(quota.keys("a"), 0);
  EXPECT_EQ(quota.bytes("a"), 0);
  EXPECT_EQ(quota.keys("b"), 1);
}

TEST_F(StoreQuotaTest, WritesInFlightHoldTheirRoomUntilReleased) {
  StoreQuota quota(kv_.get(), 2, 1000);
  auto first = quota.Reserve("a", "x", 10);
  auto second = quota.Reserve("a", "y", 10);
  ASSERT_TRUE(first.ok() && second.ok());
  // Neither is committed yet, but together they fill the job's keys.
  const absl::Status third = quota.Reserve("a", "z", 1).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()), HasSubstr("job a: the store holds 2 keys"));
  Commit({KvOp::Put("jobs/a/kv/x", std::string(10, 'v'))});
  quota.Release(*first);
  quota.Release(*second);  // its write failed: nothing was stored
  EXPECT_EQ(quota.keys("a"), 1);
  EXPECT_TRUE(quota.Reserve("a", "z", 1).ok());
}

TEST_F(StoreQuotaTest, AnOverwriteCountsOnlyWhatItAdds) {
  Commit({KvOp::Put("jobs/a/kv/x", std::string(90, 'v'))});
  StoreQuota quota(kv_.get(), 1, 100);
  // Same key: no new key, and the 91 bytes it replaces are given back.
  EXPECT_TRUE(quota.Reserve("a", "x", 99).ok());
  const absl::Status bigger = quota.Reserve("a", "x", 100).status();
  EXPECT_EQ(bigger.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(bigger.message()), HasSubstr("past 100 bytes (--max-store-bytes)"));
}

}  // namespace
}  // namespace zerod::server
