#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/shard_plan.h"
#include "runtime/plan/synthetic_layout.h"

namespace zerod::plan {
namespace {

using ::testing::HasSubstr;

PlanInput SevenPointFiveB(int64_t world, int stage, std::optional<int64_t> budget) {
  PlanInput in;
  in.tensors = SyntheticLayout(7'500'000'000, DType::kBFloat16);
  in.options.world_size = world;
  in.options.stage = stage;
  in.options.budget_bytes = budget;
  return in;
}

int64_t Allocated(int64_t world, int stage) {
  return ShardPlan::Create(SevenPointFiveB(world, stage, std::nullopt))->AllocatedBytesPerRank();
}

TEST(StageSelect, AutoWithoutBudgetIsPlainDataParallel) {
  auto plan = ShardPlan::Create(SevenPointFiveB(64, kAutoStage, std::nullopt));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stage(), 0);
}

TEST(StageSelect, AutoPicksTheLowestStageThatFits) {
  for (int want = 0; want <= 3; ++want) {
    const int64_t budget = Allocated(64, want);  // exactly enough for `want`
    auto plan = ShardPlan::Create(SevenPointFiveB(64, kAutoStage, budget));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->stage(), want);
    EXPECT_LE(plan->AllocatedBytesPerRank(), budget);
  }
}

TEST(StageSelect, NothingFitsSaysWhichWorldSizeOrBudgetWould) {
  const int64_t stage3 = Allocated(64, 3);
  const int64_t budget = stage3 * 3 / 4;
  auto plan = ShardPlan::Create(SevenPointFiveB(64, kAutoStage, budget));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("no ZeRO stage fits"));
  // The advised world size is the smallest that fits.
  const size_t at = message.find("fits at ");
  ASSERT_NE(at, std::string::npos) << message;
  const int64_t ranks = std::stoll(message.substr(at + 8));
  EXPECT_LE(Allocated(ranks, 3), budget) << message;
  EXPECT_GT(Allocated(ranks - 1, 3), budget) << message;
}

TEST(StageSelect, ExplicitStageOverBudgetNamesTheStageThatFits) {
  const int64_t budget = Allocated(64, 2);
  auto plan = ShardPlan::Create(SevenPointFiveB(64, 1, budget));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("stage 1 needs"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("stage 2 fits"));
}

TEST(StageSelect, BuffersAloneOverBudgetIsExplained) {
  PlanInput in = SevenPointFiveB(64, 3, 1 << 20);  // 1 MiB cannot hold one 64 MiB unit
  auto plan = ShardPlan::Create(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("does not fit at any world size"));
}

}  // namespace
}  // namespace zerod::plan
