// Job records: key layout, and that what a formation or a change writes decodes to the same job.

#include "server/job_records.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/plan_convert.h"
#include "runtime/plan/synthetic_layout.h"
#include "server/plan_builder.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;

// The records `ops` leave in an empty store (puts only; deletes of a prefix find nothing).
std::vector<KeyValue> Apply(const std::vector<KvOp>& ops) {
  std::vector<KeyValue> records;
  for (const KvOp& op : ops) {
    if (op.kind == KvOp::Kind::kPut) records.push_back({op.key, op.value});
  }
  return records;
}

Member MemberIn(v1::MemberState state, std::string host) {
  Member m;
  m.state = state;
  m.host = std::move(host);
  m.device = "cuda:0";
  m.budget_bytes = 1 << 30;
  m.layout_digest = "d1";
  return m;
}

// A job of 3 ranks whose ranks 0 and 2 are joining, formed into generation 1 with a stage-2 plan.
class JobRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MutexLock lock(&job_.mu);
    google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
    rpc::ToProto(plan::SyntheticLayout(1 << 16, DType::kBFloat16, 4), &wire);
    job_.layout.assign(wire.begin(), wire.end());
    job_.world_size = 3;
    job_.layout_digest = "d1";
    job_.layout_digest_rank = 2;
    job_.options.set_stage(2);
    job_.members[0] = MemberIn(v1::MEMBER_JOINING, "a");
    job_.members[2] = MemberIn(v1::MEMBER_JOINING, "c");
    auto built = BuildPlan({.job_id = job_.id,
                            .layout = job_.layout,
                            .layout_digest = job_.layout_digest,
                            .options = job_.options,
                            .world_size = 3,
                            .generation = 1});
    ASSERT_TRUE(built.ok()) << built.status();
    inputs_ = built->inputs;
    records_ = Apply(FormationRecords(job_, inputs_));
  }

  Job job_{"llama"};
  v1::PlanInputs inputs_;
  std::vector<KeyValue> records_;
  const absl::Time lease_end_ = absl::FromUnixSeconds(1'800'000'000);
};

TEST(JobKeys, LayOutAJobUnderItsPrefix) {
  EXPECT_EQ(MetaKey("llama"), "jobs/llama/meta");
  EXPECT_EQ(PlanKey("llama"), "jobs/llama/plan");
  EXPECT_EQ(MemberKey("llama", 12), "jobs/llama/members/000000012");
  EXPECT_EQ(StoreKeyPrefix("llama"), "jobs/llama/kv/");
  // Zero-padded, so that members range in rank order.
  EXPECT_LT(MemberKey("llama", 9), MemberKey("llama", 10));
}

TEST_F(JobRecordsTest, AFormedJobDecodesAsRunningWithItsJoinersActive) {
  auto decoded = DecodeJob("llama", records_, lease_end_);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  Job& job = **decoded;
  MutexLock lock(&job.mu);
  EXPECT_EQ(job.world_size, 3);
  EXPECT_EQ(job.generation, 1);
  EXPECT_EQ(job.state, v1::JOB_RUNNING);
  EXPECT_EQ(job.layout_digest, "d1");
  EXPECT_EQ(job.layout_digest_rank, 2);
  EXPECT_EQ(job.options.stage(), 2);
  ASSERT_TRUE(job.plan.has_value());
  EXPECT_EQ(job.plan->plan_digest(), inputs_.plan_digest());
  EXPECT_EQ(job.shard_plan->DigestHex(), inputs_.plan_digest());
  EXPECT_EQ(*job.plan_bytes, inputs_.SerializeAsString());
  EXPECT_EQ(static_cast<int>(job.layout.size()), inputs_.tensors_size());
  ASSERT_TRUE(job.members.contains(0));
  EXPECT_FALSE(job.members.contains(1));
  const Member& c = job.members.at(2);
  EXPECT_EQ(c.state, v1::MEMBER_ACTIVE);
  EXPECT_EQ(c.generation, 1);
  EXPECT_EQ(c.host, "c");
  EXPECT_EQ(c.device, "cuda:0");
  EXPECT_EQ(c.budget_bytes, 1 << 30);
  EXPECT_EQ(c.lease_expiry, lease_end_);
  EXPECT_EQ(job.slots.live(), 2);
  EXPECT_EQ(job.slots.LowestFree(), 1);
}

TEST_F(JobRecordsTest, LostAndLeftMembersFreeTheirRanksAndLostOnesAreRemembered) {
  {
    MutexLock lock(&job_.mu);
    job_.members[0].state = v1::MEMBER_LOST;
    job_.members[2].state = v1::MEMBER_LEFT;
    records_.push_back({MemberKey("llama", 0), EncodeMember(job_.members[0])});
    records_.push_back({MemberKey("llama", 2), EncodeMember(job_.members[2])});
    records_.push_back({MetaKey("llama"), EncodeMeta(job_, 3, v1::JOB_DEGRADED)});
  }
  // The later records of a key are what the store holds: keep only those.
  std::map<std::string, std::string> latest;
  for (const KeyValue& kv : records_) latest[kv.key] = kv.value;
  std::vector<KeyValue> stored;
  for (const auto& [key, value] : latest) stored.push_back({key, value});
  auto decoded = DecodeJob("llama", stored, lease_end_);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  Job& job = **decoded;
  MutexLock lock(&job.mu);
  EXPECT_EQ(job.generation, 3);
  EXPECT_EQ(job.state, v1::JOB_DEGRADED);
  EXPECT_EQ(job.members[0].state, v1::MEMBER_LOST);
  EXPECT_EQ(job.members[0].lease_expiry, absl::InfinitePast());  // no lease for the lost
  EXPECT_EQ(job.slots.live(), 0);
  EXPECT_EQ(job.slots.lost(), (std::set<int64_t>{0}));
  EXPECT_EQ(job.slots.LowestFree(), 0);
}

TEST_F(JobRecordsTest, AJobWithoutMetaIsDataLoss) {
  std::vector<KeyValue> no_meta;
  for (const KeyValue& kv : records_) {
    if (kv.key != MetaKey("llama")) no_meta.push_back(kv);
  }
  auto decoded = DecodeJob("llama", no_meta, lease_end_);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("job llama has no meta record"));
}

TEST_F(JobRecordsTest, CorruptRecordsAreDataLossNamingTheRecord) {
  struct Case {
    std::string key;
    std::string value;
    std::string says;
  };
  const std::vector<Case> cases = {
      {MetaKey("llama"), "{not json", "corrupt record"},
      {MetaKey("llama"), R"({"world_size": 3})", "corrupt record"},
      {MetaKey("llama"),
       R"({"world_size": -1, "generation": 1, "state": 1, "layout_digest": "d1",
           "layout_digest_rank": 0, "options": "{}"})",
       "world size -1 is out of range"},
      {PlanKey("llama"), "\xff\xff\xff", "jobs/llama/plan"},
      {MembersPrefix("llama") + "x", "{}", "bad rank"},
      {MemberKey("llama", 7), "{}", "bad rank"},
      {MemberKey("llama", 1), "[]", "corrupt record"},
      {MetaKey("llama"),
       R"({"world_size": 3, "generation": 1, "state": 99, "layout_digest": "d1",
           "layout_digest_rank": 0, "options": "{}"})",
       "job state 99 is unknown"},
      {MemberKey("llama", 1),
       R"({"state": -4, "host": "h", "device": "cpu", "budget_bytes": 0, "layout_digest": "d1",
           "generation": 1})",
       "member state -4 is unknown"},
      // Numbers no int64 holds are damage, not values to convert (found by job_records_fuzz).
      {MemberKey("llama", 1),
       R"({"state": 1, "host": "h", "device": "cpu", "budget_bytes": 1.07e62,
           "layout_digest": "d1", "generation": 1})",
       "'budget_bytes' is not an integer in range"},
      {MemberKey("llama", 1),
       R"({"state": 1, "host": "h", "device": "cpu", "budget_bytes": 0, "layout_digest": "d1",
           "generation": 18446744073709551615})",
       "'generation' is not an integer in range"},
      {MetaKey("llama"),
       R"({"world_size": 3, "generation": 1, "state": 4294967297, "layout_digest": "d1",
           "layout_digest_rank": 0, "options": "{}"})",
       "job state 4294967297 is unknown"},
  };
  for (const Case& c : cases) {
    std::vector<KeyValue> records = records_;
    bool replaced = false;
    for (KeyValue& kv : records) {
      if (kv.key != c.key) continue;
      kv.value = c.value;
      replaced = true;
    }
    if (!replaced) records.push_back({c.key, c.value});
    auto decoded = DecodeJob("llama", records, lease_end_);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << c.key << " = " << c.value;
    EXPECT_THAT(std::string(decoded.status().message()), HasSubstr(c.says)) << c.key;
  }
}

TEST_F(JobRecordsTest, FormationRewritesEveryMemberAndReplacesOldOnes) {
  MutexLock lock(&job_.mu);
  const std::vector<KvOp> ops = FormationRecords(job_, inputs_);
  ASSERT_GE(ops.size(), 5u);
  EXPECT_EQ(ops[0].key, MetaKey("llama"));
  EXPECT_EQ(ops[1].key, PlanKey("llama"));
  EXPECT_EQ(ops[2].kind, KvOp::Kind::kDeletePrefix);
  EXPECT_EQ(ops[2].key, MembersPrefix("llama"));
  EXPECT_EQ(ops[3].key, MemberKey("llama", 0));
  EXPECT_EQ(ops[4].key, MemberKey("llama", 2));
  EXPECT_EQ(ops.size(), 5u);
}

TEST(JobKeys, AKeyBelongsToTheJobItIsFiledUnder) {
  EXPECT_EQ(JobOfKey("jobs/llama/meta"), "llama");
  EXPECT_EQ(JobOfKey("jobs/llama/kv/a/b"), "llama");
  EXPECT_EQ(JobOfKey("jobs/llama"), "");
  EXPECT_EQ(JobOfKey("auth/jobs/llama"), "");
}

TEST(Quarantine, MovesEveryRecordAsStoredAndSaysWhyAndWhere) {
  const std::vector<KeyValue> intact = {{"jobs/j/meta", "{}"}, {"jobs/j/kv/addr", "a"}};
  const std::vector<DamagedRecord> damaged = {{"jobs/j/members/000000001", "bad\x01", "why"}};
  auto [ops, moved_to] = QuarantineRecords("j", intact, damaged, 42, "record x is damaged");
  EXPECT_EQ(moved_to, "quarantine/j/r42/");
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[0].key, "quarantine/j/r42/meta");
  EXPECT_EQ(ops[1].key, "quarantine/j/r42/kv/addr");
  EXPECT_EQ(ops[2].key, "quarantine/j/r42/members/000000001");
  EXPECT_EQ(ops[2].value, "bad\x01");
  EXPECT_EQ(ops[3].key, "quarantine/j/r42/reason");
  EXPECT_EQ(ops[4].kind, KvOp::Kind::kDeletePrefix);
  EXPECT_EQ(ops[4].key, "jobs/j/");

  // Read back at the next start: the latest quarantine of each id, a user key named "reason"
  // inside a moved job's store not taken for one.
  std::vector<KeyValue> records = Apply(ops);
  records.push_back({"quarantine/j/r7/reason", "older"});
  records.push_back({"quarantine/j/r42/kv/reason", "a store value"});
  const std::map<std::string, std::string> jobs = QuarantinedJobs(records);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs.at("j"), "record x is damaged; its records are kept under quarantine/j/r42/");
}

}  // namespace
}  // namespace zerod::server
