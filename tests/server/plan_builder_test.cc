// Plan building: what a formed job's ranks receive, the smallest budget, and refusals.

#include "server/plan_builder.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/plan_convert.h"
#include "runtime/plan/synthetic_layout.h"
#include "server/join_admission.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;

std::vector<v1::TensorSpec> Layout(int64_t params) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
  rpc::ToProto(plan::SyntheticLayout(params, DType::kBFloat16, 8), &wire);
  return {wire.begin(), wire.end()};
}

v1::PlanOptions Stage(int stage) {
  v1::PlanOptions options;
  options.set_stage(stage);
  return options;
}

TEST(BuildPlan, GivesEveryRankTheInputsToRebuildTheSamePlan) {
  const std::vector<v1::TensorSpec> layout = Layout(1 << 20);
  const v1::PlanOptions options = Stage(3);
  auto built = BuildPlan({.job_id = "llama",
                          .layout = layout,
                          .layout_digest = "feedc0de",
                          .options = options,
                          .world_size = 4,
                          .generation = 2});
  ASSERT_TRUE(built.ok()) << built.status();
  const v1::PlanInputs& in = built->inputs;
  EXPECT_EQ(in.world_size(), 4);
  EXPECT_EQ(in.generation(), 2);
  EXPECT_EQ(in.layout_digest(), "feedc0de");
  EXPECT_EQ(in.tensors_size(), static_cast<int>(layout.size()));
  EXPECT_EQ(in.budget_bytes(), 0);
  EXPECT_EQ(in.options().stage(), 3);
  EXPECT_EQ(in.plan_digest(), built->shard_plan->DigestHex());
  EXPECT_EQ(in.allocated_bytes_per_rank(), built->shard_plan->AllocatedBytesPerRank());
  auto rebuilt = rpc::PlanFromInputs(in);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(rebuilt->DigestHex(), in.plan_digest());
}

TEST(BuildPlan, ABudgetThatFitsIsRecordedAndBoundsThePlan) {
  const std::vector<v1::TensorSpec> layout = Layout(1 << 20);
  const v1::PlanOptions options = Stage(1);
  auto unbounded = BuildPlan(
      {.job_id = "llama", .layout = layout, .options = options, .world_size = 2, .generation = 1});
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  const int64_t budget = unbounded->shard_plan->AllocatedBytesPerRank() * 2;
  auto bounded = BuildPlan({.job_id = "llama",
                            .layout = layout,
                            .options = options,
                            .world_size = 2,
                            .generation = 1,
                            .budget_bytes = budget});
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(bounded->inputs.budget_bytes(), budget);
  EXPECT_LE(bounded->inputs.allocated_bytes_per_rank(), budget);
}

TEST(BuildPlan, ABudgetNothingFitsIsRefusedNamingTheJob) {
  const std::vector<v1::TensorSpec> layout = Layout(1 << 20);
  const v1::PlanOptions options = Stage(2);
  auto built = BuildPlan({.job_id = "llama",
                          .layout = layout,
                          .options = options,
                          .world_size = 2,
                          .generation = 1,
                          .budget_bytes = 1000});
  ASSERT_EQ(built.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(built.status().message()), HasSubstr("job llama: "));
  EXPECT_THAT(std::string(built.status().message()), HasSubstr("stage 2 needs"));
}

TEST(BuildPlan, NoLayoutIsRefused) {
  const std::vector<v1::TensorSpec> none;
  const v1::PlanOptions options = Stage(0);
  auto built = BuildPlan(
      {.job_id = "llama", .layout = none, .options = options, .world_size = 2, .generation = 1});
  ASSERT_EQ(built.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(built.status().message()),
              HasSubstr("job llama: no rank sent the parameter layout"));
}

TEST(SmallestBudget, TakesTheSmallestOfLiveMembersThatSetOne) {
  auto member = [](v1::MemberState state, int64_t budget) {
    Member m;
    m.state = state;
    m.budget_bytes = budget;
    return m;
  };
  EXPECT_EQ(SmallestBudget({}), 0);
  EXPECT_EQ(SmallestBudget({{0, member(v1::MEMBER_ACTIVE, 0)}}), 0);
  EXPECT_EQ(SmallestBudget({{0, member(v1::MEMBER_JOINING, 900)},
                            {1, member(v1::MEMBER_ACTIVE, 0)},
                            {2, member(v1::MEMBER_ACTIVE, 700)},
                            {3, member(v1::MEMBER_LOST, 100)},
                            {7, member(v1::MEMBER_LEFT, 200)}}),
            700);
}

// The planner runs once every rank joined, so a world is as large as --max-world-size allows: the
// plan of the largest world any daemon accepts is numbers per segment, not a piece per rank.
TEST(BuildPlan, APlanForTheLargestWorldAnyDaemonAcceptsStaysSmall) {
  const std::vector<v1::TensorSpec> layout = Layout(1 << 20);
  const v1::PlanOptions options = Stage(3);
  auto built = BuildPlan({.job_id = "huge",
                          .layout = layout,
                          .options = options,
                          .world_size = kHardMaxWorldSize,
                          .generation = 1});
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->shard_plan->world_size(), kHardMaxWorldSize);
  EXPECT_LT(built->inputs.ByteSizeLong(), size_t{64} << 10);
}

}  // namespace
}  // namespace zerod::server
