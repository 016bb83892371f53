#include "server/state/etcd_kv_store.h"

#include <atomic>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "server/state/etcd_claim.h"
#include "tests/util/etcd_cluster.h"
#include "tests/util/failure_injecting_proxy.h"
#include "tests/util/test_time.h"

namespace zerod::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using zerod::testing::EtcdCluster;
using zerod::testing::Scaled;

#define SKIP_WITHOUT_ETCD()      \
  if (!EtcdCluster::Installed()) \
  GTEST_SKIP() << EtcdCluster::kBinary << " is not installed: run scripts/setup.sh"

EtcdOptions Options(const std::vector<std::string>& endpoints, const std::string& prefix = "/t/") {
  EtcdOptions options;
  options.endpoints = endpoints;
  options.prefix = prefix;
  options.request_timeout = Scaled(options.request_timeout);
  return options;
}

std::unique_ptr<EtcdKvStore> Open(const EtcdOptions& options) {
  auto kv = EtcdKvStore::Open(options);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? *std::move(kv) : nullptr;
}

// Waits (generously) until `condition` holds; the watch brings other stores' writes a little later.
template <typename F>
bool Eventually(F condition) {
  const absl::Time deadline = absl::Now() + Scaled(absl::Seconds(30));
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(ParseEtcdUrl, ReadsEndpointsAndPrefix) {
  auto one = ParseEtcdUrl("etcd://127.0.0.1:2379");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->endpoints, std::vector<std::string>{"127.0.0.1:2379"});
  EXPECT_EQ(one->prefix, "/zerod/");
  auto three = ParseEtcdUrl("etcd://a:1,b.example:2,10.0.0.3:2379/clusters/east");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->endpoints, (std::vector<std::string>{"a:1", "b.example:2", "10.0.0.3:2379"}));
  EXPECT_EQ(three->prefix, "/clusters/east/");
  EXPECT_EQ(ParseEtcdUrl("etcd://h:1/p/")->prefix, "/p/");
}

TEST(ParseEtcdUrl, RefusesWhatItCannotUseNamingIt) {
  struct Case {
    std::string url, names;
  } cases[] = {{"http://h:1", "does not start with etcd://"},
               {"etcd://", "endpoint '' is not host:port"},
               {"etcd://h", "endpoint 'h' is not host:port"},
               {"etcd://h:0", "endpoint 'h:0'"},
               {"etcd://h:70000", "endpoint 'h:70000'"},
               {"etcd://h:1,,g:2", "endpoint ''"},
               {"etcd://:1", "endpoint ':1'"},
               {"etcd://h:x/p", "endpoint 'h:x'"},
               {"etcd://h:1//p", "prefix '//p/' has an empty part"}};
  for (const Case& c : cases) {
    auto parsed = ParseEtcdUrl(c.url);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.url;
    EXPECT_THAT(parsed.status().message(), AllOf(HasSubstr(c.url), HasSubstr(c.names)));
  }
}

class EtcdKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    cluster_ = std::make_unique<EtcdCluster>(1);
    ASSERT_EQ(cluster_->error(), "");
  }
  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdKvStoreTest, PutGetRangeDeleteWithRevisions) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  auto r1 = kv->CommitSync({KvOp::Put("a/1", "x"), KvOp::Put("a/2", "y"), KvOp::Put("b/1", "z")});
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(kv->Get("a/1")->value, "x");  // `done` ran after the watch brought it
  EXPECT_EQ(kv->Range("a/").size(), 2u);
  EXPECT_EQ(kv->revision(), r1->revision);
  auto r2 = kv->CommitSync({KvOp::Put("a/1", "x2")});
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_GT(r2->revision, r1->revision);
  const KeyValue a1 = *kv->Get("a/1");
  EXPECT_EQ(a1.create_revision, r1->revision);
  EXPECT_EQ(a1.mod_revision, r2->revision);
  EXPECT_EQ(a1.version, 2);
  auto r3 = kv->CommitSync({KvOp::Delete("a/2"), KvOp::Delete("missing")});
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_TRUE(r3->results[0].applied);
  EXPECT_FALSE(r3->results[1].applied);
  EXPECT_FALSE(kv->Get("a/2").has_value());
  auto r4 = kv->CommitSync({KvOp::DeletePrefix("a/")});
  ASSERT_TRUE(r4.ok()) << r4.status();
  EXPECT_TRUE(kv->Range("a/").empty());
  EXPECT_EQ(kv->Range("b/").size(), 1u);
  EXPECT_EQ(kv->revision(), r4->revision);
  EXPECT_TRUE(kv->Damaged("").empty());
}

TEST_F(EtcdKvStoreTest, AddAndCompareAndSwap) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(*kv->CommitSync({KvOp::Add("n", 5)})->results[0].value, "5");
  EXPECT_EQ(*kv->CommitSync({KvOp::Add("n", -7)})->results[0].value, "-2");
  auto swapped = kv->CommitSync({KvOp::CompareAndSwap("c", std::nullopt, "v1")});
  EXPECT_TRUE(swapped->results[0].applied);
  auto refused = kv->CommitSync(
      {KvOp::CompareAndSwap("c", std::string("other"), "v2"), KvOp::Put("after", "1")});
  EXPECT_FALSE(refused->results[0].applied);
  EXPECT_EQ(*refused->results[0].value, "v1");
  EXPECT_EQ(kv->Get("c")->value, "v1");
  EXPECT_EQ(kv->Get("after")->value, "1");  // the rest of the transaction applies
  auto overflow = kv->CommitSync({KvOp::Put("big", "9223372036854775807"), KvOp::Add("big", 1)});
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(EtcdKvStoreTest, AFailingOpWritesNothingOfItsTransaction) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  auto first = kv->CommitSync({KvOp::Put("text", "hello")});
  ASSERT_TRUE(first.ok()) << first.status();
  auto failed = kv->CommitSync({KvOp::Put("other", "1"), KvOp::Add("text", 1)});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(failed.status().message(), HasSubstr("key 'text' holds 'hello', not an integer"));
  EXPECT_FALSE(kv->Get("other").has_value());
  EXPECT_EQ(kv->revision(), first->revision);
  auto fresh = Open(Options(cluster_->Endpoints()));
  EXPECT_FALSE(fresh->Get("other").has_value());
}

TEST_F(EtcdKvStoreTest, OpsOnOneKeyAndAPrefixDeletedThenWrittenInOneTransaction) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("p/old", "1"), KvOp::Put("p/kept", "1")}).ok());
  // etcd refuses a Txn that writes one key twice or puts a key inside a range it deletes.
  auto r =
      kv->CommitSync({KvOp::Put("k", "1"), KvOp::Put("k", "2"), KvOp::Add("k", 3),
                      KvOp::DeletePrefix("p/"), KvOp::Put("p/kept", "2"), KvOp::Add("p/n", 1)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->results[2].value, "5");
  EXPECT_EQ(*r->results[5].value, "1");
  EXPECT_EQ(kv->Get("k")->value, "5");
  EXPECT_FALSE(kv->Get("p/old").has_value());
  EXPECT_EQ(kv->Get("p/kept")->value, "2");
  EXPECT_EQ(kv->Get("p/n")->value, "1");
  EXPECT_EQ(kv->Range("p/").size(), 2u);
  // A key put and then deleted with its prefix: a point delete inside a range delete.
  auto gone = kv->CommitSync({KvOp::Put("p/x", "1"), KvOp::DeletePrefix("p/")});
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(kv->Range("p/").empty());
}

TEST_F(EtcdKvStoreTest, ATransactionOverEtcdsLimitFailsNamingTheLimitAndWritesNothing) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  std::vector<KvOp> ops;
  for (int i = 0; i < 200; ++i) ops.push_back(KvOp::Put(absl::StrCat("r/", i), "x"));
  auto r = kv->CommitSync(ops);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("etcd at " + cluster_->Endpoint(0)), HasSubstr("200 writes"),
                    HasSubstr("--max-txn-ops")));
  EXPECT_TRUE(kv->Range("r/").empty());
  EXPECT_TRUE(kv->CommitSync({KvOp::Put("after", "1")}).ok());  // the store goes on
}

TEST_F(EtcdKvStoreTest, EverythingCommittedIsThereForAFreshStore) {
  {
    auto kv = Open(Options(cluster_->Endpoints()));
    ASSERT_NE(kv, nullptr);
    ASSERT_TRUE(kv->CommitSync({KvOp::Put("a", "1"), KvOp::Add("n", 2)}).ok());
  }
  auto kv = Open(Options(cluster_->Endpoints()));
  EXPECT_EQ(kv->Get("a")->value, "1");
  EXPECT_EQ(kv->Get("n")->value, "2");
  // Another prefix is another state.
  auto other = Open(Options(cluster_->Endpoints(), "/other/"));
  EXPECT_TRUE(other->Range("").empty());
}

TEST_F(EtcdKvStoreTest, WatchSeesCommittedChangesUnderItsPrefix) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
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
  EXPECT_LT(seen[0].revision, seen[1].revision);
}

TEST_F(EtcdKvStoreTest, ConcurrentCommitsAreAllApplied) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  Mutex mu;
  int done = 0;
  constexpr int kCommits = 200;
  for (int i = 0; i < kCommits; ++i) {
    kv->Commit({KvOp::Add("counter", 1)}, [&](absl::StatusOr<CommitResult> r) {
      EXPECT_TRUE(r.ok()) << r.status();
      MutexLock lock(&mu);
      ++done;
    });
  }
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == kCommits; });
  }
  EXPECT_EQ(kv->Get("counter")->value, absl::StrCat(kCommits));
}

// Commits queued behind one in flight go to etcd together (group commit): each keeps the results
// it would have had alone, in order, and the group takes one revision.
TEST_F(EtcdKvStoreTest, QueuedCommitsGoTogetherAndEachKeepsItsOwnResults) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  const int64_t before = kv->revision();
  constexpr int kCommits = 300;
  Mutex mu;
  std::vector<absl::StatusOr<CommitResult>> results(kCommits, absl::UnknownError("not done"));
  int done = 0;
  for (int i = 0; i < kCommits; ++i) {
    // An add on one counter, and every third commit also a put of its own key and a
    // compare-and-swap that only the first of them wins.
    std::vector<KvOp> ops = {KvOp::Add("counter", 1)};
    if (i % 3 == 0) {
      ops.push_back(KvOp::Put(absl::StrCat("own/", i), absl::StrCat(i)));
      ops.push_back(KvOp::CompareAndSwap("first", std::nullopt, absl::StrCat(i)));
    }
    kv->Commit(std::move(ops), [&, i](absl::StatusOr<CommitResult> r) {
      MutexLock lock(&mu);
      results[i] = std::move(r);
      ++done;
    });
  }
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == kCommits; });
  }
  std::set<int64_t> revisions;
  for (int i = 0; i < kCommits; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    const CommitResult& r = *results[i];
    ASSERT_EQ(r.results.size(), i % 3 == 0 ? 3u : 1u) << i;
    EXPECT_EQ(r.results[0].value, absl::StrCat(i + 1)) << i;  // as if one after another
    if (i % 3 == 0) {
      EXPECT_EQ(r.results[1].value, absl::StrCat(i));
      EXPECT_EQ(r.results[2].applied, i == 0) << i;
      EXPECT_EQ(r.results[2].value, "0") << i;
    }
    revisions.insert(r.revision);
  }
  EXPECT_EQ(kv->Get("counter")->value, absl::StrCat(kCommits));
  EXPECT_EQ(kv->Range("own/").size(), static_cast<size_t>(kCommits / 3));
  // Far fewer Txns than commits: all queued within microseconds, behind the first's round trip.
  EXPECT_LT(revisions.size(), static_cast<size_t>(kCommits / 4));
  EXPECT_EQ(kv->revision() - before, static_cast<int64_t>(revisions.size()));
  // A fresh store reads the same.
  auto fresh = Open(Options(cluster_->Endpoints()));
  EXPECT_EQ(fresh->Get("counter")->value, absl::StrCat(kCommits));
  EXPECT_EQ(fresh->Get("first")->value, "0");
}

// A commit that fails on its own (an add on a non-integer) fails alone, though it was queued
// among others: they land.
TEST_F(EtcdKvStoreTest, ACommitThatFailsInAGroupFailsAloneAndTheOthersLand) {
  auto kv = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("text", "hello")}).ok());
  Mutex mu;
  std::vector<absl::StatusOr<CommitResult>> results(5, absl::UnknownError("not done"));
  int done = 0;
  const std::vector<std::vector<KvOp>> commits = {{KvOp::Put("a", "1")},
                                                  {KvOp::Add("n", 5)},
                                                  {KvOp::Put("b", "2"), KvOp::Add("text", 1)},
                                                  {KvOp::Add("n", 1)},
                                                  {KvOp::Put("c", "3")}};
  for (size_t i = 0; i < commits.size(); ++i) {
    kv->Commit(commits[i], [&, i](absl::StatusOr<CommitResult> r) {
      MutexLock lock(&mu);
      results[i] = std::move(r);
      ++done;
    });
  }
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == 5; });
  }
  for (size_t i : {0u, 1u, 3u, 4u}) EXPECT_TRUE(results[i].ok()) << i << results[i].status();
  EXPECT_EQ(results[2].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(results[2].status().message(), HasSubstr("key 'text' holds 'hello'"));
  EXPECT_EQ(results[3]->results[0].value, "6");
  auto fresh = Open(Options(cluster_->Endpoints()));
  EXPECT_EQ(fresh->Get("a")->value, "1");
  EXPECT_FALSE(fresh->Get("b").has_value());  // the failed commit wrote nothing
  EXPECT_EQ(fresh->Get("c")->value, "3");
  EXPECT_EQ(fresh->Get("n")->value, "6");
  EXPECT_EQ(fresh->Get("text")->value, "hello");
}

// Told a larger --max-txn-ops than this etcd has (its default, 128), the store's groups are
// refused by etcd: their commits then go one by one, and every one lands.
TEST_F(EtcdKvStoreTest, AGroupOverEtcdsLimitIsRetriedCommitByCommit) {
  EtcdOptions options = Options(cluster_->Endpoints());
  options.max_txn_ops = 100000;
  auto kv = Open(options);
  ASSERT_NE(kv, nullptr);
  constexpr int kCommits = 300;
  Mutex mu;
  int done = 0, failed = 0;
  for (int i = 0; i < kCommits; ++i) {
    kv->Commit({KvOp::Put(absl::StrCat("k/", i), "v")}, [&](absl::StatusOr<CommitResult> r) {
      MutexLock lock(&mu);
      if (!r.ok()) ++failed;
      ++done;
    });
  }
  MutexLock lock(&mu);
  mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == kCommits; });
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(kv->Range("k/").size(), static_cast<size_t>(kCommits));
}

TEST_F(EtcdKvStoreTest, TwoStoresSeeEachOthersWritesAndLoseNoIncrement) {
  auto a = Open(Options(cluster_->Endpoints()));
  auto b = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::atomic<int> b_saw{0};
  b->Watch("from-a", [&](const std::vector<KvEvent>& events) { b_saw += events.size(); });
  ASSERT_TRUE(a->CommitSync({KvOp::Put("from-a", "1")}).ok());
  EXPECT_TRUE(Eventually([&] { return b->Get("from-a").has_value(); }));
  EXPECT_TRUE(Eventually([&] { return b_saw.load() == 1; }));

  // Both add to one key at once: each Add reads etcd, and retries when the other got there first.
  constexpr int kEach = 60;
  auto adder = [](EtcdKvStore* kv) {
    for (int i = 0; i < kEach; ++i) {
      auto r = kv->CommitSync({KvOp::Add("shared", 1)});
      EXPECT_TRUE(r.ok()) << r.status();
    }
  };
  std::thread ta(adder, a.get());
  std::thread tb(adder, b.get());
  ta.join();
  tb.join();
  EXPECT_TRUE(Eventually([&] {
    auto va = a->Get("shared");
    auto vb = b->Get("shared");
    return va && vb && va->value == absl::StrCat(2 * kEach) && vb->value == va->value;
  })) << a->Get("shared")->value;
  // A compare-and-swap on the other's write sees etcd's value, not a stale mirror.
  auto swapped = b->CommitSync({KvOp::CompareAndSwap("from-a", std::string("1"), "2")});
  EXPECT_TRUE(swapped->results[0].applied);
}

TEST_F(EtcdKvStoreTest, AStoreFencedOnAClaimItLostWritesNothingMore) {
  EtcdOptions options = Options(cluster_->Endpoints());
  auto first =
      EtcdClaim::TryAcquire(options, EtcdClaimOptions{Scaled(absl::Seconds(5)), "a"}, [] {});
  ASSERT_TRUE(first.ok() && first->claim != nullptr) << first.status();
  options.fence_key = first->claim->key();
  options.fence_create_revision = first->claim->create_revision();
  auto fenced = Open(options);
  ASSERT_NE(fenced, nullptr);
  ASSERT_TRUE(fenced->CommitSync({KvOp::Put("k", "while held")}).ok());
  // The claim goes (its holder paused past the lease, say) and another member takes it.
  first->claim.reset();
  auto second = EtcdClaim::TryAcquire(Options(cluster_->Endpoints()),
                                      EtcdClaimOptions{Scaled(absl::Seconds(5)), "b"}, [] {});
  ASSERT_TRUE(second.ok() && second->claim != nullptr) << second.status();
  auto late = fenced->CommitSync({KvOp::Put("k", "after losing it"), KvOp::Add("n", 1)});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("no longer holds /t.claim"));
  auto fresh = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->Get("k")->value, "while held");
  EXPECT_FALSE(fresh->Get("n").has_value());
}

TEST_F(EtcdKvStoreTest, EveryMemberDownFailsCommitsUnavailableNamingTheEndpoints) {
  EtcdOptions options = Options(cluster_->Endpoints());
  options.request_timeout = Scaled(absl::Seconds(3));
  options.unavailable_for = absl::Seconds(2);
  auto kv = Open(options);
  ASSERT_NE(kv, nullptr);
  cluster_->Kill(0);
  const absl::Time start = absl::Now();
  auto r = kv->CommitSync({KvOp::Put("a", "1")});
  EXPECT_GE(absl::Now() - start, absl::Seconds(2));  // it kept trying for unavailable_for
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("etcd at " + cluster_->Endpoint(0)));
  // The next one does not wait all over again while nothing answers.
  EXPECT_EQ(kv->CommitSync({KvOp::Add("n", 1)}).status().code(), absl::StatusCode::kUnavailable);

  auto none = EtcdKvStore::Open(options);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("etcd at " + cluster_->Endpoint(0)));

  // Back up: commits go through again, and the mirror catches up.
  cluster_->Restart(0);
  ASSERT_EQ(cluster_->Leader(), 0);
  auto again = kv->CommitSync({KvOp::Put("b", "2")});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(kv->Get("b")->value, "2");
}

TEST_F(EtcdKvStoreTest, ClosingWhileEtcdIsDownFailsQueuedCommits) {
  EtcdOptions options = Options(cluster_->Endpoints());
  options.request_timeout = Scaled(absl::Seconds(1));
  auto kv = Open(options);
  ASSERT_NE(kv, nullptr);
  cluster_->Kill(0);
  Mutex mu;
  std::vector<absl::Status> outcomes;
  for (int i = 0; i < 3; ++i) {
    kv->Commit({KvOp::Put("a", "1")}, [&](absl::StatusOr<CommitResult> r) {
      MutexLock lock(&mu);
      outcomes.push_back(r.status());
    });
  }
  kv.reset();  // does not wait unavailable_for (30 s)
  MutexLock lock(&mu);
  ASSERT_EQ(outcomes.size(), 3u);
  for (const absl::Status& s : outcomes) EXPECT_FALSE(s.ok());
}

// etcd applies a Txn whose reply never arrives; the retry must find that out, not apply it again.
TEST_F(EtcdKvStoreTest, ACommitWhoseReplyWasLostIsAppliedOnce) {
  zerod::testing::FailureInjectingProxy proxy(cluster_->Endpoint(0));
  EtcdOptions options = Options({proxy.address()});
  options.request_timeout = Scaled(absl::Seconds(2));
  auto kv = Open(options);
  auto direct = Open(Options(cluster_->Endpoints()));
  ASSERT_NE(kv, nullptr);
  ASSERT_NE(direct, nullptr);
  ASSERT_TRUE(kv->CommitSync({KvOp::Put("before", "1")}).ok());

  proxy.DropReplies(true);
  Mutex mu;
  std::optional<absl::StatusOr<CommitResult>> outcome;
  kv->Commit({KvOp::Put("k", "v")}, [&](absl::StatusOr<CommitResult> r) {
    MutexLock lock(&mu);
    outcome = std::move(r);
  });
  ASSERT_TRUE(Eventually([&] { return direct->Get("k").has_value(); }));  // etcd applied it
  // The call in flight fails (UNAVAILABLE) without its reply; the store reconnects and retries.
  proxy.DropReplies(false);
  proxy.CloseConnections();
  {
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return outcome.has_value(); });
    ASSERT_TRUE(outcome->ok()) << outcome->status();
  }
  auto fresh = Open(Options(cluster_->Endpoints()));
  const KeyValue k = *fresh->Get("k");
  EXPECT_EQ(k.version, 1);  // written once
  MutexLock lock(&mu);
  EXPECT_EQ((*outcome)->revision, k.mod_revision);
  EXPECT_EQ(kv->Get("k")->mod_revision, k.mod_revision);
}

TEST(EtcdKvStore, OpenWithNoEtcdIsUnavailableNamingTheEndpoints) {
  EtcdOptions options = Options({"127.0.0.1:1"});
  options.request_timeout = Scaled(absl::Seconds(2));
  auto kv = EtcdKvStore::Open(options);
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(kv.status().message(), HasSubstr("etcd at 127.0.0.1:1"));
}

// Three members: the leader dies while commits flow.
TEST(EtcdKvStoreCluster, EveryAcknowledgedCommitSurvivesTheLeadersDeath) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster(3);
  ASSERT_EQ(cluster.error(), "");
  EtcdOptions options = Options(cluster.Endpoints());
  options.request_timeout = Scaled(absl::Seconds(2));
  auto kv = Open(options);
  ASSERT_NE(kv, nullptr);
  std::atomic<int> acknowledged{0};
  std::atomic<bool> failed{false};
  constexpr int kCommits = 80;
  std::thread writer([&] {
    for (int i = 0; i < kCommits; ++i) {
      // An add counts the commits that landed: one applied twice would count twice.
      auto r = kv->CommitSync({KvOp::Put(absl::StrCat("k/", i), "v"), KvOp::Add("count", 1)});
      if (!r.ok()) {
        ADD_FAILURE() << "commit " << i << ": " << r.status();
        failed = true;
        return;
      }
      ++acknowledged;
    }
  });
  ASSERT_TRUE(Eventually([&] { return acknowledged.load() >= 20 || failed.load(); }));
  const int leader = cluster.Leader();
  ASSERT_GE(leader, 0);
  cluster.Kill(leader);
  writer.join();
  ASSERT_FALSE(failed.load());
  EXPECT_EQ(acknowledged.load(), kCommits);  // commits continued after the election
  auto fresh = Open(options);
  ASSERT_NE(fresh, nullptr);
  for (int i = 0; i < kCommits; ++i) EXPECT_TRUE(fresh->Get(absl::StrCat("k/", i))) << i;
  EXPECT_EQ(fresh->Get("count")->value, absl::StrCat(kCommits));
}

// A store whose watch was away while etcd compacted reloads its mirror and tells its watchers.
TEST(EtcdKvStoreCluster, AWatchBehindACompactionReloadsTheMirror) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster cluster(3);
  ASSERT_EQ(cluster.error(), "");
  // `pinned` talks to member 0 only, `other` to the rest.
  auto pinned = Open(Options({cluster.Endpoint(0)}));
  auto other = Open(Options({cluster.Endpoint(1), cluster.Endpoint(2)}));
  ASSERT_NE(pinned, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->CommitSync({KvOp::Put("gone", "1"), KvOp::Put("changed", "1")}).ok());
  ASSERT_TRUE(Eventually([&] { return pinned->Get("changed").has_value(); }));
  Mutex mu;
  std::map<std::string, std::optional<std::string>> seen;
  pinned->Watch("", [&](const std::vector<KvEvent>& events) {
    MutexLock lock(&mu);
    for (const KvEvent& e : events) seen[e.key] = e.value;
  });

  cluster.Kill(0);
  ASSERT_GE(cluster.Leader(), 0);
  auto r = other->CommitSync({KvOp::Delete("gone"), KvOp::Put("changed", "2")});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(other->CommitSync({KvOp::Put("new", "3")}).ok());
  {
    auto kv = etcdserverpb::KV::NewStub(
        grpc::CreateChannel(cluster.Endpoint(1), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    etcdserverpb::CompactionRequest compact;
    compact.set_revision(other->revision());
    compact.set_physical(true);
    etcdserverpb::CompactionResponse compacted;
    ASSERT_TRUE(kv->Compact(&context, compact, &compacted).ok());
  }
  cluster.Restart(0);
  EXPECT_TRUE(Eventually([&] {
    auto v = pinned->Get("new");
    return v && v->value == "3";
  }));
  EXPECT_FALSE(pinned->Get("gone").has_value());
  EXPECT_EQ(pinned->Get("changed")->value, "2");
  EXPECT_TRUE(Eventually([&] {
    MutexLock lock(&mu);
    return seen.size() == 3;
  }));
  MutexLock lock(&mu);
  EXPECT_FALSE(seen["gone"].has_value());
  EXPECT_EQ(seen["changed"], "2");
  EXPECT_EQ(seen["new"], "3");
}

}  // namespace
}  // namespace zerod::server
