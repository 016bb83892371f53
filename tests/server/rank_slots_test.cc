// RankSlots: which ranks are free, live and lost, through takes, frees and losses.

#include "server/rank_slots.h"

#include "gtest/gtest.h"

namespace zerod::server {
namespace {

TEST(RankSlots, HandsOutRanksInOrderUntilFull) {
  RankSlots slots;
  slots.Reset(3);
  for (int64_t r = 0; r < 3; ++r) {
    ASSERT_EQ(slots.LowestFree(), r);
    ASSERT_TRUE(slots.Take(r));
  }
  EXPECT_EQ(slots.LowestFree(), std::nullopt);
  EXPECT_EQ(slots.live(), 3);
}

TEST(RankSlots, TakingAHighRankLeavesTheOnesBelowFree) {
  RankSlots slots;
  slots.Reset(4);
  ASSERT_TRUE(slots.Take(2));
  EXPECT_EQ(slots.LowestFree(), 0);
  EXPECT_TRUE(slots.IsFree(0));
  EXPECT_TRUE(slots.IsFree(1));
  EXPECT_FALSE(slots.IsFree(2));
  EXPECT_TRUE(slots.IsFree(3));
  ASSERT_TRUE(slots.Take(0));
  ASSERT_TRUE(slots.Take(1));
  EXPECT_EQ(slots.LowestFree(), 3);
  EXPECT_EQ(slots.live(), 3);
}

TEST(RankSlots, AFreedRankIsTheNextHandedOut) {
  RankSlots slots;
  slots.Reset(3);
  for (int64_t r = 0; r < 3; ++r) ASSERT_TRUE(slots.Take(r));
  ASSERT_TRUE(slots.Free(1));
  EXPECT_EQ(slots.live(), 2);
  EXPECT_EQ(slots.LowestFree(), 1);
  ASSERT_TRUE(slots.Take(1));
  EXPECT_EQ(slots.LowestFree(), std::nullopt);
}

TEST(RankSlots, RefusesToTakeALiveRankOrFreeAFreeOne) {
  RankSlots slots;
  slots.Reset(2);
  ASSERT_TRUE(slots.Take(0));
  EXPECT_FALSE(slots.Take(0));
  EXPECT_FALSE(slots.Free(1));  // never taken
  ASSERT_TRUE(slots.Free(0));
  EXPECT_FALSE(slots.Free(0));  // twice
  EXPECT_FALSE(slots.MarkLost(0));
  EXPECT_EQ(slots.live(), 0);
  EXPECT_TRUE(slots.lost().empty());
}

TEST(RankSlots, RefusesRanksOutsideTheWorld) {
  RankSlots slots;
  slots.Reset(2);
  EXPECT_FALSE(slots.Take(-1));
  EXPECT_FALSE(slots.Take(2));
  EXPECT_FALSE(slots.Free(5));
  EXPECT_FALSE(slots.IsFree(2));
  EXPECT_EQ(slots.live(), 0);
}

TEST(RankSlots, ALostRankIsFreeAndRememberedUntilTakenAgain) {
  RankSlots slots;
  slots.Reset(3);
  for (int64_t r = 0; r < 3; ++r) ASSERT_TRUE(slots.Take(r));
  ASSERT_TRUE(slots.MarkLost(2));
  ASSERT_TRUE(slots.MarkLost(0));
  EXPECT_EQ(slots.lost(), (std::set<int64_t>{0, 2}));
  EXPECT_EQ(slots.live(), 1);
  EXPECT_EQ(slots.LowestFree(), 0);
  ASSERT_TRUE(slots.Take(0));
  EXPECT_EQ(slots.lost(), (std::set<int64_t>{2}));
}

TEST(RankSlots, ResetForgetsEverything) {
  RankSlots slots;
  slots.Reset(2);
  ASSERT_TRUE(slots.Take(0));
  ASSERT_TRUE(slots.Take(1));
  ASSERT_TRUE(slots.MarkLost(1));
  slots.Reset(5);
  EXPECT_EQ(slots.world_size(), 5);
  EXPECT_EQ(slots.live(), 0);
  EXPECT_TRUE(slots.lost().empty());
  EXPECT_EQ(slots.LowestFree(), 0);
  EXPECT_TRUE(slots.IsFree(4));
}

}  // namespace
}  // namespace zerod::server
