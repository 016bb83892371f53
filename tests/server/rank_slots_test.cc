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

TEST(RankSlots, TakingTheLastRankOfAHugeWorldLeavesTheRanksBelowFreeWithoutListingThem) {
  // The old bookkeeping listed every skipped rank as freed: 2^62 of them here.
  constexpr int64_t kWorld = int64_t{1} << 62;
  RankSlots slots;
  slots.Reset(kWorld);
  ASSERT_TRUE(slots.Take(kWorld - 1));
  EXPECT_EQ(slots.LowestFree(), 0);
  EXPECT_TRUE(slots.IsFree(kWorld - 2));
  EXPECT_FALSE(slots.IsFree(kWorld - 1));
  ASSERT_TRUE(slots.Take(0));
  EXPECT_EQ(slots.LowestFree(), 1);
  EXPECT_EQ(slots.live(), 2);
}

TEST(RankSlots, RunsOfLiveRanksJoinAndSplit) {
  RankSlots slots;
  slots.Reset(10);
  for (int64_t r : {0, 1, 3, 4, 6}) ASSERT_TRUE(slots.Take(r));
  EXPECT_EQ(slots.LowestFree(), 2);
  ASSERT_TRUE(slots.Take(2));  // joins 0-1 and 3-4
  EXPECT_EQ(slots.LowestFree(), 5);
  ASSERT_TRUE(slots.Take(5));  // joins 0-4 and 6
  EXPECT_EQ(slots.LowestFree(), 7);
  ASSERT_TRUE(slots.Free(3));  // splits 0-6
  EXPECT_EQ(slots.LowestFree(), 3);
  for (int64_t r : {0, 1, 2, 4, 5, 6}) EXPECT_FALSE(slots.IsFree(r)) << r;
  EXPECT_FALSE(slots.Free(3));
  ASSERT_TRUE(slots.Free(0));  // the first rank of a run
  ASSERT_TRUE(slots.Free(6));  // the last
  EXPECT_EQ(slots.LowestFree(), 0);
  EXPECT_EQ(slots.live(), 4);
  for (int64_t r : {1, 2, 4, 5}) EXPECT_FALSE(slots.IsFree(r)) << r;
}

}  // namespace
}  // namespace zerod::server
