// JobStore on a real SQLite store and a FakeClock: values, compare-set, add, limits, blocking
// gets, waits and barriers, their timeouts (by advancing the clock), and shutdown.

#include "server/job_store.h"

#include <future>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_registry.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;

// The answer of one call, as a future.
template <class T>
struct Call {
  std::shared_ptr<std::promise<T>> promise = std::make_shared<std::promise<T>>();
  std::future<T> future = promise->get_future();
  std::function<void(T)> Done() {
    return [p = promise](T v) { p->set_value(std::move(v)); };
  }
};

template <class T>
bool Answered(const std::future<T>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = *SqliteKvStore::Open(dir_.path() + "/state.db", Durability::kNormal);
    store_ = std::make_unique<JobStore>(
        kv_.get(), &clock_,
        [](const std::string& id) {
          // As the daemon's check answers: the registry's not-found error.
          return id == "llama" || id == "other" ? absl::OkStatus() : JobNotFound(id);
        },
        limits_);
  }

  absl::StatusOr<int64_t> Set(const std::string& key, std::string value,
                              const std::string& job = "llama") {
    Call<absl::StatusOr<int64_t>> call;
    store_->Set(job, key, std::move(value), call.Done());
    return call.future.get();
  }
  std::future<absl::StatusOr<KeyValue>> Get(const std::string& key, absl::Duration timeout,
                                            const std::string& job = "llama",
                                            absl::Time call_deadline = absl::InfiniteFuture()) {
    Call<absl::StatusOr<KeyValue>> call;
    store_->Get(job, key, {timeout, call_deadline}, call.Done());
    return std::move(call.future);
  }
  std::future<absl::Status> Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
    Call<absl::Status> call;
    store_->Wait("llama", keys, {timeout}, call.Done());
    return std::move(call.future);
  }
  // Returns once the barrier's arrival is written and its wait registered.
  std::future<absl::Status> Barrier(const std::string& name, int64_t participant, int64_t count,
                                    absl::Duration timeout) {
    Call<absl::Status> call;
    store_->Barrier("llama", name, participant, count, {timeout}, call.Done());
    // Commits call back in order, so once a later one has, the barrier has registered.
    EXPECT_TRUE(Set("_sync", "").ok());
    return std::move(call.future);
  }
  absl::StatusOr<CompareSetResult> CompareSet(const std::string& key,
                                              std::optional<std::string> expected,
                                              std::string desired) {
    Call<absl::StatusOr<CompareSetResult>> call;
    store_->CompareSet("llama", key, std::move(expected), std::move(desired), call.Done());
    return call.future.get();
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) {
    Call<absl::StatusOr<int64_t>> call;
    store_->Add("llama", key, delta, call.Done());
    return call.future.get();
  }
  absl::StatusOr<bool> Delete(const std::string& key) {
    Call<absl::StatusOr<bool>> call;
    store_->Delete("llama", key, call.Done());
    return call.future.get();
  }

  // A store with a job's keys and bytes limited so (a new JobStore over the same state).
  void LimitEachJob(int64_t keys, int64_t bytes) {
    store_.reset();
    limits_.max_keys_per_job = keys;
    limits_.max_bytes_per_job = bytes;
    SetUp();
  }
  absl::Status Arrive(const std::string& name, int64_t participant, int64_t count) {
    Call<absl::Status> call;
    store_->Barrier("llama", name, participant, count, {absl::ZeroDuration()}, call.Done());
    return call.future.get();
  }

  testing::TempDir dir_;
  FakeClock clock_;
  StoreLimits limits_{.max_key_bytes = 16, .max_value_bytes = 64, .longest_wait = absl::Hours(1)};
  std::unique_ptr<SqliteKvStore> kv_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(JobStoreTest, SetThenGetAnswersTheValueAndItsRevision) {
  auto revision = Set("addr", "10.0.0.1:29500");
  ASSERT_TRUE(revision.ok()) << revision.status();
  auto got = Get("addr", absl::ZeroDuration()).get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "10.0.0.1:29500");
  EXPECT_EQ(got->mod_revision, *revision);
  EXPECT_GT(*Set("addr", "10.0.0.2:29500"), *revision);
}

TEST_F(JobStoreTest, KeysBelongToTheirJob) {
  ASSERT_TRUE(Set("addr", "a").ok());
  EXPECT_EQ(Get("addr", absl::ZeroDuration(), "other").get().status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobStoreTest, GetWithoutATimeoutDoesNotWait) {
  const absl::Status s = Get("addr", absl::ZeroDuration()).get().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), HasSubstr("job llama: key 'addr' is not set"));
}

TEST_F(JobStoreTest, ABlockingGetIsAnsweredByTheSet) {
  auto got = Get("addr", absl::Seconds(10));
  EXPECT_FALSE(Answered(got));
  ASSERT_TRUE(Set("addr", "x").ok());
  // The commit wakes waiters before it answers its writer.
  ASSERT_TRUE(Answered(got));
  auto r = got.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, "x");
}

TEST_F(JobStoreTest, ABlockingGetTimesOutWhenTheClockSaysSo) {
  auto got = Get("addr", absl::Milliseconds(500));
  clock_.Advance(absl::Milliseconds(499));
  EXPECT_FALSE(Answered(got));
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Answered(got));
  const absl::Status s = got.get().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(s), HasSubstr("job llama: key 'addr' was not set within 500ms"));
}

TEST_F(JobStoreTest, AWaitEndsAtTheLongestWaitOrTheCallsDeadline) {
  auto long_wait = Get("a", absl::Hours(5));
  auto short_call = Get("b", absl::Hours(5), "llama", clock_.Now() + absl::Seconds(3));
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(Answered(short_call));
  const absl::Status short_status = short_call.get().status();
  EXPECT_EQ(short_status.code(), absl::StatusCode::kDeadlineExceeded);
  // The message names the wait that ran, not the 5 hours asked for.
  EXPECT_THAT(Message(short_status), HasSubstr("key 'b' was not set within 3s"));
  clock_.Advance(absl::Hours(1) - absl::Seconds(3) - absl::Nanoseconds(1));
  EXPECT_FALSE(Answered(long_wait));
  clock_.Advance(absl::Nanoseconds(1));
  ASSERT_TRUE(Answered(long_wait));
  const absl::Status long_status = long_wait.get().status();
  EXPECT_EQ(long_status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(long_status), HasSubstr("key 'a' was not set within 1h"));
}

TEST_F(JobStoreTest, AnAnswerMayStartAnotherWait) {
  // Waiters are answered outside every lock of the store: this one's answer waits again.
  Call<absl::StatusOr<KeyValue>> second;
  Call<absl::StatusOr<KeyValue>> first;
  store_->Get("llama", "a", {absl::Seconds(10)}, [&](absl::StatusOr<KeyValue> r) {
    store_->Get("llama", "b", {absl::Seconds(10)}, second.Done());
    first.Done()(std::move(r));
  });
  ASSERT_TRUE(Set("a", "1").ok());
  ASSERT_TRUE(first.future.get().ok());
  EXPECT_FALSE(Answered(second.future));
  ASSERT_TRUE(Set("b", "2").ok());
  EXPECT_EQ(second.future.get()->value, "2");
}

TEST_F(JobStoreTest, WaitReturnsOnceEveryKeyExists) {
  ASSERT_TRUE(Set("a", "1").ok());
  EXPECT_TRUE(Answered(Wait({"a"}, absl::Seconds(1))));  // at once
  EXPECT_TRUE(Wait({}, absl::Seconds(1)).get().ok());
  auto waiting = Wait({"a", "b", "c", "b"}, absl::Seconds(10));
  ASSERT_TRUE(Set("b", "2").ok());
  EXPECT_FALSE(Answered(waiting));
  ASSERT_TRUE(Set("c", "3").ok());
  ASSERT_TRUE(Answered(waiting));
  EXPECT_TRUE(waiting.get().ok());
}

TEST_F(JobStoreTest, AWaitThatTimesOutNamesTheKeysStillMissing) {
  auto waiting = Wait({"a", "b", "c"}, absl::Seconds(2));
  ASSERT_TRUE(Set("b", "2").ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Answered(waiting));
  const absl::Status s = waiting.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(s), "job llama: keys not set in time: a, c");
}

TEST_F(JobStoreTest, ABarrierReturnsWhenItsCountOfDistinctParticipantsArrived) {
  auto p0 = Barrier("init", 0, 3, absl::Seconds(10));
  auto p1 = Barrier("init", 1, 3, absl::Seconds(10));
  auto p1_again = Barrier("init", 1, 3, absl::Seconds(10));  // a retry counts once
  EXPECT_FALSE(Answered(p0));
  EXPECT_FALSE(Answered(p1));
  EXPECT_FALSE(Answered(p1_again));
  auto p2 = Barrier("init", 2, 3, absl::Seconds(10));
  for (auto* f : {&p0, &p1, &p1_again, &p2}) {
    ASSERT_TRUE(Answered(*f));
    EXPECT_TRUE(f->get().ok());
  }
  // Barriers of other names are apart.
  EXPECT_FALSE(Answered(Barrier("step", 0, 2, absl::Seconds(10))));
}

TEST_F(JobStoreTest, ALateParticipantCountsThoseThatArrivedBefore) {
  auto p0 = Barrier("init", 0, 2, absl::Seconds(10));
  auto p1 = Barrier("init", 1, 2, absl::Seconds(10));
  ASSERT_TRUE(p0.get().ok());
  ASSERT_TRUE(p1.get().ok());
  // Nobody waits at "init" any more; the arrivals are only in the store.
  EXPECT_TRUE(Barrier("init", 2, 3, absl::Seconds(10)).get().ok());
  EXPECT_TRUE(Barrier("solo", 9, 1, absl::Seconds(10)).get().ok());
}

TEST_F(JobStoreTest, ABarrierThatTimesOutSaysHowManyItWaitedFor) {
  auto p0 = Barrier("init", 0, 2, absl::Seconds(5));
  clock_.Advance(absl::Seconds(4));
  EXPECT_FALSE(Answered(p0));
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Answered(p0));
  const absl::Status s = p0.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(s), "job llama: barrier 'init' did not reach 2 participants in time");
  // Its arrival stays: the next participant completes the barrier.
  EXPECT_TRUE(Barrier("init", 1, 2, absl::Seconds(5)).get().ok());
}

TEST_F(JobStoreTest, ABarrierNeedsACountAndANameWithoutSlash) {
  for (auto [name, count] : {std::pair<std::string, int64_t>{"init", 0}, {"a/b", 2}}) {
    Call<absl::Status> call;
    store_->Barrier("llama", name, 0, count, {absl::Seconds(1)}, call.Done());
    const absl::Status s = call.future.get();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(Message(s), HasSubstr("needs a count >= 1 and a name without '/'"));
  }
}

TEST_F(JobStoreTest, CompareSetSwapsOnlyOnTheExpectedValue) {
  auto created = CompareSet("leader", std::nullopt, "rank0");
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->swapped);
  EXPECT_EQ(created->value, "rank0");
  auto taken = CompareSet("leader", std::nullopt, "rank1");
  EXPECT_FALSE(taken->swapped);
  EXPECT_EQ(taken->value, "rank0");
  auto wrong = CompareSet("leader", "rank2", "rank1");
  EXPECT_FALSE(wrong->swapped);
  EXPECT_EQ(wrong->value, "rank0");
  auto right = CompareSet("leader", "rank0", "rank1");
  EXPECT_TRUE(right->swapped);
  EXPECT_EQ(right->value, "rank1");
  auto absent = CompareSet("nobody", "x", "y");
  EXPECT_FALSE(absent->swapped);
  EXPECT_EQ(absent->value, "");
}

TEST_F(JobStoreTest, AddCountsFromZeroAndRefusesText) {
  EXPECT_EQ(*Add("n", 5), 5);
  EXPECT_EQ(*Add("n", -7), -2);
  ASSERT_TRUE(Set("text", "hello").ok());
  const absl::Status s = Add("text", 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(s), HasSubstr("job llama: "));
}

TEST_F(JobStoreTest, AddRefusesToWrapPastInt64AndKeepsTheValue) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(*Add("n", max - 1), max - 1);
  EXPECT_EQ(*Add("n", 1), max);
  const absl::Status over = Add("n", 1).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(Message(over), HasSubstr("adding 1 would overflow a 64-bit integer"));
  EXPECT_EQ(*Add("n", 0), max);  // unchanged
  EXPECT_EQ(*Add("m", std::numeric_limits<int64_t>::min()), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Add("m", -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(JobStoreTest, DeleteSaysWhetherTheKeyExisted) {
  ASSERT_TRUE(Set("k", "v").ok());
  EXPECT_TRUE(*Delete("k"));
  EXPECT_FALSE(*Delete("k"));
  EXPECT_EQ(Get("k", absl::ZeroDuration()).get().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStoreTest, KeysAndValuesOverTheLimitsAreRefusedWithTheirSizes) {
  const absl::Status empty = Set("", "v").status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(empty), HasSubstr("job llama: empty key"));
  const absl::Status long_key = Set(std::string(17, 'k'), "v").status();
  EXPECT_EQ(long_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(long_key), HasSubstr("is 17 bytes, over 16"));
  EXPECT_TRUE(Set(std::string(16, 'k'), std::string(64, 'v')).ok());
  const absl::Status big = Set("k", std::string(65, 'v')).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(big), HasSubstr("value for key 'k' is 65 bytes, over the limit of 64"));
  // CompareSet writes too: the same limit, and nothing is stored.
  const absl::Status big_swap = CompareSet("c", std::nullopt, std::string(65, 'v')).status();
  EXPECT_EQ(big_swap.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(big_swap), HasSubstr("value for key 'c' is 65 bytes, over the limit of 64"));
  EXPECT_EQ(Get("c", absl::ZeroDuration()).get().status().code(), absl::StatusCode::kNotFound);
  Call<absl::Status> wait;
  store_->Wait("llama", {"ok", std::string(17, 'k')}, {absl::Seconds(1)}, wait.Done());
  EXPECT_EQ(wait.future.get().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStoreTest, EveryCallOfAnUnknownJobIsNotFound) {
  const std::string job = "nope";
  std::vector<absl::Status> answers;
  answers.push_back(Set("k", "v", job).status());
  answers.push_back(Get("k", absl::Seconds(1), job).get().status());
  Call<absl::StatusOr<int64_t>> add;
  store_->Add(job, "k", 1, add.Done());
  answers.push_back(add.future.get().status());
  Call<absl::StatusOr<CompareSetResult>> cas;
  store_->CompareSet(job, "k", std::nullopt, "v", cas.Done());
  answers.push_back(cas.future.get().status());
  Call<absl::StatusOr<bool>> del;
  store_->Delete(job, "k", del.Done());
  answers.push_back(del.future.get().status());
  Call<absl::Status> wait;
  store_->Wait(job, {"k"}, {absl::Seconds(1)}, wait.Done());
  answers.push_back(wait.future.get());
  Call<absl::Status> barrier;
  store_->Barrier(job, "b", 0, 1, {absl::Seconds(1)}, barrier.Done());
  answers.push_back(barrier.future.get());
  for (const absl::Status& s : answers) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(Message(s), HasSubstr("job nope not found"));
  }
  // A megabyte-long id is not echoed back whole.
  const absl::Status huge = Set("k", "v", std::string(1 << 20, 'j')).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(huge), HasSubstr("... (1048576 bytes) not found"));
  EXPECT_LT(Message(huge).size(), 200u);
}

TEST_F(JobStoreTest, ShutdownAnswersEveryWaitingCall) {
  auto got = Get("a", absl::Seconds(10));
  auto waiting = Wait({"b"}, absl::Seconds(10));
  auto barrier = Barrier("init", 0, 2, absl::Seconds(10));
  store_->Shutdown();
  for (const absl::Status& s : {got.get().status(), waiting.get(), barrier.get()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(Message(s), HasSubstr("shutting down"));
  }
  // A deadline after shutdown answers nobody twice.
  clock_.Advance(absl::Seconds(10));
}

TEST_F(JobStoreTest, AWriteThatWouldPassTheJobsKeyLimitIsRefusedAndNothingIsStored) {
  LimitEachJob(3, 1 << 20);
  ASSERT_TRUE(Set("a", "1").ok());
  ASSERT_TRUE(Set("b", "2").ok());
  ASSERT_TRUE(Add("n", 1).ok());
  const absl::Status full = Set("d", "4").status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(full), HasSubstr("job llama: the store holds 3 keys, the most a job may (3, "
                                       "--max-store-keys); key 'd' was not written"));
  EXPECT_EQ(Get("d", absl::ZeroDuration()).get().status().code(), absl::StatusCode::kNotFound);
  // Every call that writes a new key is checked.
  EXPECT_EQ(CompareSet("d", std::nullopt, "4").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Add("m", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Arrive("init", 0, 1).code(), absl::StatusCode::kResourceExhausted);
  // Keys held may change; other jobs are not limited by this one.
  EXPECT_TRUE(Set("a", "11").ok());
  EXPECT_TRUE(CompareSet("b", "2", "22")->swapped);
  EXPECT_EQ(*Add("n", 1), 2);
  EXPECT_TRUE(Set("d", "4", "other").ok());
  // A delete makes room.
  ASSERT_TRUE(*Delete("a"));
  EXPECT_TRUE(Set("d", "4").ok());
}

TEST_F(JobStoreTest, AWriteThatWouldPassTheJobsByteLimitIsRefusedAndNothingIsStored) {
  LimitEachJob(100, 40);                                             // bytes of keys and values
  ASSERT_TRUE(Set("a", std::string(30, 'x')).ok());                  // 31 bytes
  const absl::Status over = Set("b", std::string(9, 'y')).status();  // 10 more: 41
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(over), HasSubstr("job llama: writing 10 bytes at key 'b' would take the "
                                       "store past 40 bytes (--max-store-bytes); it holds 31"));
  EXPECT_EQ(Get("b", absl::ZeroDuration()).get().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CompareSet("b", std::nullopt, std::string(9, 'y')).status().code(),
            absl::StatusCode::kResourceExhausted);
  // An overwrite counts what it replaces.
  EXPECT_TRUE(Set("a", std::string(39, 'x')).ok());
  EXPECT_EQ(Set("a", std::string(40, 'x')).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Get("a", absl::ZeroDuration()).get()->value, std::string(39, 'x'));
  ASSERT_TRUE(*Delete("a"));
  EXPECT_TRUE(Set("b", std::string(9, 'y')).ok());
}

TEST_F(JobStoreTest, WhatIsStoredWhenTheDaemonStartsCountsAgainstTheLimits) {
  ASSERT_TRUE(Set("a", "1").ok());
  ASSERT_TRUE(Set("b", "2").ok());
  LimitEachJob(2, 1 << 20);
  EXPECT_EQ(Set("c", "3").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Set("a", "11").ok());
}

TEST_F(JobStoreTest, WaitsAndBarriersLargerThanAJobsStoreAreRefused) {
  LimitEachJob(4, 1 << 20);
  Call<absl::Status> wait;
  store_->Wait("llama", {"a", "b", "c", "d", "e"}, {absl::Seconds(1)}, wait.Done());
  const absl::Status waited = wait.future.get();
  EXPECT_EQ(waited.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(waited), HasSubstr("a wait for 5 keys, more than a job's store may hold (4"));
  const absl::Status barrier = Arrive("init", 0, 5);
  EXPECT_EQ(barrier.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(barrier), HasSubstr("barrier 'init' of 5 participants can never complete"));
}

TEST_F(JobStoreTest, ErrorsShowAPrefixOfALongKey) {
  limits_.max_key_bytes = 4096;
  LimitEachJob(100, 1 << 20);
  const std::string key(4000, 'k');
  const absl::Status big = Set(key, std::string(65, 'v')).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(big), HasSubstr("... (4000 bytes)' is 65 bytes"));
  EXPECT_LT(Message(big).size(), 300u);
  const absl::Status missing = Get(key, absl::ZeroDuration()).get().status();
  EXPECT_LT(Message(missing).size(), 300u);
}

}  // namespace
}  // namespace zerod::server
