// StoreWaits on a real SQLite store and a FakeClock: keys and barriers complete their waiters
// once, by commit, deadline or shutdown.

#include "server/store_waits.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

// Counts a waiter's answers and keeps the last.
class Answers {
 public:
  std::shared_ptr<StoreWaiter> Waiter() {
    return std::make_shared<StoreWaiter>([this](absl::Status s) {
      MutexLock lock(&mu_);
      ++count_;
      last_ = std::move(s);
    });
  }
  int count() {
    MutexLock lock(&mu_);
    return count_;
  }
  absl::Status last() {
    MutexLock lock(&mu_);
    return last_;
  }

 private:
  Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_ ABSL_GUARDED_BY(mu_);
};

class StoreWaitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = *SqliteKvStore::Open(dir_.path() + "/state.db", Durability::kNormal);
    waits_ = std::make_unique<StoreWaits>(kv_.get(), &clock_, "w/");
  }
  // Watchers see a commit before CommitSync returns.
  void Put(const std::string& key) { ASSERT_TRUE(kv_->CommitSync({KvOp::Put(key, "1")}).ok()); }

  testing::TempDir dir_;
  FakeClock clock_;
  Answers answers_;
  std::unique_ptr<SqliteKvStore> kv_;
  std::unique_ptr<StoreWaits> waits_;
};

TEST(StoreWaiter, AnswersOnlyTheFirstCompletion) {
  Answers answers;
  auto waiter = answers.Waiter();
  waiter->Complete(absl::OkStatus());
  waiter->Complete(absl::DeadlineExceededError("late"));
  EXPECT_EQ(answers.count(), 1);
  EXPECT_TRUE(answers.last().ok());
}

TEST_F(StoreWaitsTest, KeysThatExistCompleteAtOnce) {
  Put("w/a");
  waits_->AwaitKeys(answers_.Waiter(), {"w/a"}, clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(answers_.count(), 1);
  EXPECT_TRUE(answers_.last().ok());
}

TEST_F(StoreWaitsTest, TheCommitOfTheLastMissingKeyCompletes) {
  waits_->AwaitKeys(answers_.Waiter(), {"w/a", "w/b"}, clock_.Now() + absl::Seconds(1));
  Put("w/a");
  ASSERT_TRUE(kv_->CommitSync({KvOp::Delete("w/a")}).ok());  // it arrived; leaving is no undo
  EXPECT_EQ(answers_.count(), 0);
  Put("w/b");
  EXPECT_EQ(answers_.count(), 1);
  EXPECT_TRUE(answers_.last().ok());
}

TEST_F(StoreWaitsTest, TheDeadlineNamesTheKeysStillMissing) {
  waits_->AwaitKeys(answers_.Waiter(), {"w/a", "w/b"}, clock_.Now() + absl::Seconds(1));
  Put("w/b");
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(answers_.count(), 1);
  EXPECT_EQ(answers_.last().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answers_.last().message(), "keys not set in time: w/a");
  Put("w/a");  // too late: no second answer
  EXPECT_EQ(answers_.count(), 1);
}

TEST_F(StoreWaitsTest, TheDeadlineOfAWaitForManyKeysNamesAFewAndTheCount) {
  std::vector<std::string> keys;
  for (int i = 0; i < 10000; ++i) keys.push_back("w/" + std::to_string(100000 + i));
  waits_->AwaitKeys(answers_.Waiter(), keys, clock_.Now() + absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  ASSERT_EQ(answers_.count(), 1);
  EXPECT_EQ(answers_.last().message(),
            "keys not set in time: w/100000, w/100001, w/100002, w/100003, w/100004, w/100005, "
            "w/100006, w/100007, ... (10000 keys)");
}

TEST_F(StoreWaitsTest, ABarrierCountsArrivalsBeforeAndAfterItsWaiter) {
  Put("w/b/0");
  Put("w/b/1");
  waits_->AwaitBarrier(answers_.Waiter(), "w/b/", 4, clock_.Now() + absl::Seconds(1));
  Put("w/b/1");    // a participant twice counts once
  Put("w/c/2");    // another barrier
  Put("w/b/2/x");  // below a participant, not one
  EXPECT_EQ(answers_.count(), 0);
  Put("w/b/3");
  EXPECT_EQ(answers_.count(), 0);
  Put("w/b/2");
  EXPECT_EQ(answers_.count(), 1);
  EXPECT_TRUE(answers_.last().ok());
}

TEST_F(StoreWaitsTest, ABarrierReachedAlreadyCompletesAtOnce) {
  Put("w/b/0");
  waits_->AwaitBarrier(answers_.Waiter(), "w/b/", 1, clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(answers_.count(), 1);
}

TEST_F(StoreWaitsTest, ABarrierDeadlineAnswersOnlyItsOwnWaiter) {
  Answers later;
  waits_->AwaitBarrier(answers_.Waiter(), "w/b/", 2, clock_.Now() + absl::Seconds(1));
  waits_->AwaitBarrier(later.Waiter(), "w/b/", 2, clock_.Now() + absl::Seconds(2));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(answers_.last().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(later.count(), 0);
  Put("w/b/0");
  Put("w/b/1");
  EXPECT_EQ(later.count(), 1);
  EXPECT_TRUE(later.last().ok());
  EXPECT_EQ(answers_.count(), 1);
}

TEST_F(StoreWaitsTest, ShutdownAnswersEveryWaiterOnce) {
  Answers barrier;
  waits_->AwaitKeys(answers_.Waiter(), {"w/a"}, clock_.Now() + absl::Seconds(1));
  waits_->AwaitBarrier(barrier.Waiter(), "w/b/", 2, clock_.Now() + absl::Seconds(1));
  waits_->Shutdown();
  clock_.Advance(absl::Seconds(1));
  Put("w/a");
  EXPECT_EQ(answers_.count(), 1);
  EXPECT_EQ(answers_.last().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(barrier.count(), 1);
  EXPECT_EQ(barrier.last().code(), absl::StatusCode::kUnavailable);
}

TEST_F(StoreWaitsTest, AfterShutdownNobodyWaits) {
  // A barrier's arrival may commit after shutdown answered the others: it must not wait either.
  waits_->Shutdown();
  Answers keys;
  Answers barrier;
  waits_->AwaitKeys(keys.Waiter(), {"w/a"}, absl::InfiniteFuture());
  waits_->AwaitBarrier(barrier.Waiter(), "w/b/", 2, absl::InfiniteFuture());
  EXPECT_EQ(keys.count(), 1);
  EXPECT_EQ(keys.last().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(barrier.count(), 1);
  EXPECT_EQ(barrier.last().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zerod::server
