#include "server/state/internal/etcd_txn.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zerod::server::internal {
namespace {

using ::testing::ElementsAre;

// The success ops of a plan, as "put k=v" / "delete k" / "delete k..end".
std::vector<std::string> Writes(const CommitPlan& plan) {
  std::vector<std::string> out;
  for (const etcdserverpb::RequestOp& op : plan.txn.success()) {
    if (op.has_request_put()) {
      out.push_back("put " + op.request_put().key() + "=" + op.request_put().value());
    } else if (op.request_delete_range().range_end().empty()) {
      out.push_back("delete " + op.request_delete_range().key());
    } else {
      out.push_back("delete " + op.request_delete_range().key() + ".." +
                    op.request_delete_range().range_end());
    }
  }
  return out;
}

TEST(EtcdTxn, PutsOnlyNeedNoReadAndNoCondition) {
  const std::vector<KvOp> ops = {KvOp::Put("a", "1"), KvOp::Put("b", "2")};
  const CommitReads reads = ReadsFor(ops);
  EXPECT_TRUE(reads.empty());
  auto plan = PlanCommit(ops, reads, {}, "/p/");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Writes(*plan), ElementsAre("put /p/a=1", "put /p/b=2"));
  EXPECT_TRUE(plan->txn.compare().empty());
  EXPECT_TRUE(plan->puts);
}

TEST(EtcdTxn, OneKeyWrittenSeveralTimesIsPutOnceWithItsFinalValue) {
  const std::vector<KvOp> ops = {KvOp::Put("k", "1"), KvOp::Add("k", 2), KvOp::Add("k", 3)};
  const CommitReads reads = ReadsFor(ops);
  EXPECT_THAT(reads.keys, ElementsAre("k"));
  CommitSnapshot snapshot;
  snapshot.revision = 7;
  snapshot.values["k"] = {"100", 5};  // overwritten by the put before the adds use it
  auto plan = PlanCommit(ops, reads, snapshot, "/p/");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Writes(*plan), ElementsAre("put /p/k=6"));
  EXPECT_EQ(*plan->result.results[2].value, "6");
  // Conditional on k being as read.
  ASSERT_EQ(plan->txn.compare_size(), 1);
  EXPECT_EQ(plan->txn.compare(0).key(), "/p/k");
  EXPECT_EQ(plan->txn.compare(0).mod_revision(), 5);
}

TEST(EtcdTxn, APrefixDeletedThenWrittenUnderIsDeletedKeyByKey) {
  const std::vector<KvOp> ops = {KvOp::DeletePrefix("d/"), KvOp::Put("d/keep", "2")};
  const CommitReads reads = ReadsFor(ops);
  EXPECT_THAT(reads.prefixes, ElementsAre("d/"));
  CommitSnapshot snapshot;
  snapshot.revision = 9;
  snapshot.prefix_keys["d/"] = {"d/keep", "d/old"};
  auto plan = PlanCommit(ops, reads, snapshot, "/p/");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Writes(*plan), ElementsAre("delete /p/d/old", "put /p/d/keep=2"));
  // Conditional on nothing under the prefix changing after the read.
  ASSERT_EQ(plan->txn.compare_size(), 1);
  EXPECT_EQ(plan->txn.compare(0).range_end(), "/p/d0");
  EXPECT_EQ(plan->txn.compare(0).result(), etcdserverpb::Compare::LESS);
  EXPECT_EQ(plan->txn.compare(0).mod_revision(), 10);
}

TEST(EtcdTxn, APrefixDeletedAloneIsOneRangeDelete) {
  const std::vector<KvOp> ops = {KvOp::Put("d/x", "1"), KvOp::DeletePrefix("d/")};
  const CommitReads reads = ReadsFor(ops);
  EXPECT_TRUE(reads.empty());
  auto plan = PlanCommit(ops, reads, {}, "/p/");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Writes(*plan), ElementsAre("delete /p/d/../p/d0", "delete /p/d/x"));
  EXPECT_FALSE(plan->puts);
}

TEST(EtcdTxn, AnAddOnTextFailsTheWholeTransaction) {
  const std::vector<KvOp> ops = {KvOp::Put("other", "1"), KvOp::Add("text", 1)};
  CommitSnapshot snapshot;
  snapshot.values["text"] = {"hello", 3};
  auto plan = PlanCommit(ops, ReadsFor(ops), snapshot, "/p/");
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.status().message(), "key 'text' holds 'hello', not an integer");
}

TEST(EtcdTxn, NothingToWriteIsAnEmptyTxn) {
  const std::vector<KvOp> ops = {KvOp::Delete("missing"),
                                 KvOp::CompareAndSwap("c", std::string("x"), "y")};
  CommitSnapshot snapshot;
  snapshot.values["c"] = {"z", 2};
  auto plan = PlanCommit(ops, ReadsFor(ops), snapshot, "/p/");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->txn.success().empty());
  EXPECT_FALSE(plan->result.results[0].applied);
  EXPECT_FALSE(plan->result.results[1].applied);
  EXPECT_EQ(*plan->result.results[1].value, "z");
}

}  // namespace
}  // namespace zerod::server::internal
