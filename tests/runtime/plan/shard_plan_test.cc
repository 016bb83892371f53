#include "runtime/plan/shard_plan.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"

namespace zerod::plan {
namespace {

using ::testing::HasSubstr;

TensorSpec T(std::string name, std::vector<int64_t> shape, std::string unit = "") {
  return {std::move(name), std::move(shape), DType::kBFloat16, std::move(unit)};
}

PlanInput Input(std::vector<TensorSpec> tensors, int64_t world, int stage) {
  PlanInput in;
  in.tensors = std::move(tensors);
  in.options.world_size = world;
  in.options.stage = stage;
  return in;
}

TEST(ShardPlan, SegmentsArePaddedToRanksTimesAlignmentAndSlicedEvenly) {
  // 10 + 6 = 16 elements in one bucket over 3 ranks, alignment 4: padded to 24, slices of 8.
  PlanInput in = Input({T("a", {2, 5}), T("b", {6})}, 3, 2);
  in.options.partition_alignment_numel = 4;
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->segments().size(), 1u);
  EXPECT_EQ(plan->segments()[0].padded_numel, 24);
  EXPECT_EQ(plan->segments()[0].slice_numel, 8);
  EXPECT_EQ(plan->shard_numel(), 8);
  // b occupies flat [10, 16): rank 1 holds [10, 16) at its shard offsets 2..8.
  const std::vector<Piece> b = plan->Pieces(1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].owner_rank, 1);
  EXPECT_EQ(b[0].shard_offset, 2);
  EXPECT_EQ(b[0].tensor_offset, 0);
  EXPECT_EQ(b[0].numel, 6);
  // a spans rank 0 (8 elements) and rank 1 (2 elements).
  const std::vector<Piece> a = plan->Pieces(0);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].owner_rank, 0);
  EXPECT_EQ(a[0].numel, 8);
  EXPECT_EQ(a[1].owner_rank, 1);
  EXPECT_EQ(a[1].tensor_offset, 8);
  EXPECT_EQ(a[1].numel, 2);
  // Rank 2 holds only padding.
  EXPECT_EQ(plan->OwnedRealNumel(2), 0);
  EXPECT_EQ(plan->OwnedRealNumel(1), 8);
}

TEST(ShardPlan, SliceOfLocatesASliceInEveryLayout) {
  // bf16, buckets of 32 bytes filled from the end: {a} and {b, c}; 2 ranks x alignment 4 pads
  // each to 16 elements, slices of 8. Segment 1 starts at flat 16 and at shard offset 8.
  PlanInput in = Input({T("a", {10}), T("b", {6}), T("c", {5})}, 2, 2);
  in.options.partition_alignment_numel = 4;
  in.options.reduce_bucket_bytes = 32;
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->segments().size(), 2u);
  const OwnedRange r = plan->SliceOf(1, 1);
  EXPECT_EQ(r.segment, 1);
  EXPECT_EQ(r.flat_offset, 24);
  EXPECT_EQ(r.shard_offset, 8);
  EXPECT_EQ(r.segment_offset, 8);
  EXPECT_EQ(r.numel, 8);
  EXPECT_EQ(r.real_numel, 3) << "b and c hold 11 elements; rank 1 gets the last 3";
  EXPECT_EQ(r.OffsetIn(BufferLayout::kFlat), 24);
  EXPECT_EQ(r.OffsetIn(BufferLayout::kShard), 8);
  EXPECT_EQ(r.OffsetIn(BufferLayout::kSegment), 8);
  EXPECT_EQ(plan->SliceOf(0, 1).OffsetIn(BufferLayout::kSegment), 0);
  // c sits at flat 22, 6 elements into its segment.
  EXPECT_EQ(plan->placements()[2].flat_offset, 22);
  EXPECT_EQ(plan->placements()[2].segment_offset, 6);
  // At stage 2 the parameters are whole, gradients and optimizer state sharded, buckets one
  // segment each.
  for (const Allocation& a : plan->Allocations()) {
    SCOPED_TRACE(std::string(a.name));
    if (a.category == MemoryCategory::kParams) {
      EXPECT_EQ(a.layout, BufferLayout::kFlat);
      EXPECT_EQ(a.numel, 32);
    } else if (a.category == MemoryCategory::kBucketBuffers) {
      EXPECT_EQ(a.layout, BufferLayout::kSegment);
      EXPECT_EQ(a.numel, 16);
    } else {
      EXPECT_EQ(a.layout, BufferLayout::kShard);
      EXPECT_TRUE(a.sharded());
      EXPECT_EQ(a.numel, 16);
    }
  }
}

TEST(ShardPlan, AtStageZeroASliceIsTheWholeSegmentOnEveryRank) {
  PlanInput in = Input({T("a", {10}), T("b", {6}), T("c", {5})}, 2, 0);
  in.options.partition_alignment_numel = 4;
  in.options.reduce_bucket_bytes = 32;
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->segments().size(), 2u);
  const Segment& seg = plan->segments()[1];
  for (int64_t rank : {0, 1}) {
    const OwnedRange r = plan->SliceOf(rank, 1);
    EXPECT_EQ(r.segment_offset, 0);
    EXPECT_EQ(r.flat_offset, seg.flat_offset);
    EXPECT_EQ(r.shard_offset, seg.flat_offset) << "unpartitioned: the shard is the flat buffer";
    EXPECT_EQ(r.numel, seg.padded_numel);
    EXPECT_EQ(r.real_numel, 11);
  }
  for (const Allocation& a : plan->Allocations()) EXPECT_EQ(a.layout, BufferLayout::kFlat);
}

TEST(ShardPlan, StageZeroReplicatesEverything) {
  auto plan = ShardPlan::Create(Input({T("a", {100})}, 8, 0));
  ASSERT_TRUE(plan.ok());
  const std::vector<Piece> pieces = plan->Pieces(0);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].owner_rank, kReplicated);
  EXPECT_EQ(plan->shard_numel(), plan->padded_numel());
  EXPECT_EQ(plan->OwnedRealNumel(5), 100);
}

TEST(ShardPlan, ReduceBucketsHoldWholeTensorsUpToTheBucketSizeFilledFromTheEnd) {
  // bf16 grads: 100 elements = 200 bytes; bucket 500 bytes holds two such tensors.
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < 5; ++i) tensors.push_back(T("t" + std::to_string(i), {100}));
  PlanInput in = Input(tensors, 2, 2);
  in.options.reduce_bucket_bytes = 500;
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok());
  const auto& buckets = plan->reduce_buckets();
  ASSERT_EQ(buckets.size(), 3u);
  // Backward produces t4 first: {t3,t4}, {t1,t2}, {t0}.
  EXPECT_EQ(buckets[0].first_tensor, 0);
  EXPECT_EQ(buckets[0].tensor_count, 1);
  EXPECT_EQ(buckets[1].first_tensor, 1);
  EXPECT_EQ(buckets[2].first_tensor, 3);
  EXPECT_EQ(buckets[2].tensor_count, 2);
}

TEST(ShardPlan, ATensorLargerThanTheBucketIsABucketOfItsOwn) {
  PlanInput in = Input({T("small", {10}), T("big", {1000}), T("tail", {10})}, 2, 2);
  in.options.reduce_bucket_bytes = 100;
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->segments().size(), 3u);
  EXPECT_EQ(plan->segments()[1].numel, 1000);
}

TEST(ShardPlan, StageThreeGathersByCallerLabels) {
  auto plan = ShardPlan::Create(Input({T("emb", {64}, "embed"), T("l0.w", {64}, "layer0"),
                                       T("l0.b", {8}, "layer0"), T("head", {64})},
                                      4, 3));
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(plan->has_gather_units());
  ASSERT_EQ(plan->segments().size(), 3u);
  EXPECT_EQ(plan->segments()[1].first_tensor, 1);
  EXPECT_EQ(plan->segments()[1].tensor_count, 2);
  EXPECT_EQ(plan->segments()[2].first_tensor, 3);
}

TEST(ShardPlan, StageThreeGathersBySizeWithoutLabels) {
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < 6; ++i) tensors.push_back(T("t" + std::to_string(i), {256}));
  PlanInput in = Input(tensors, 2, 3);
  in.options.gather_unit_bytes = 1024;  // two 512-byte tensors per unit
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->segments().size(), 3u);
  for (const Segment& s : plan->segments()) EXPECT_EQ(s.tensor_count, 2);
}

TEST(ShardPlan, StageThreeBuffersAreCountedAsTheOptionsSay) {
  PlanInput in = Input(SyntheticLayout(1 << 20, DType::kBFloat16, 16), 4, 3);
  in.options.max_live_units = 3;
  in.options.prefetch_depth = 2;
  in.options.bucket_buffers = 2;
  auto plan = ShardPlan::Create(in);
  ASSERT_TRUE(plan.ok());
  const MemoryBreakdown m = plan->MemoryForRank(0);
  EXPECT_EQ(m[MemoryCategory::kGatherBuffers], 3 * plan->max_segment_numel() * 2);
  EXPECT_EQ(m[MemoryCategory::kBucketBuffers], 2 * plan->max_segment_numel() * 2);
}

TEST(ShardPlan, CommunicationFollowsThePaper) {
  const std::vector<TensorSpec> layout = SyntheticLayout(7'500'000'000, DType::kBFloat16);
  int64_t volume[4];
  double padding = 0;  // relative padding of the partitioned stages
  for (int stage = 0; stage <= 3; ++stage) {
    auto plan = ShardPlan::Create(Input(layout, 64, stage));
    ASSERT_TRUE(plan.ok());
    volume[stage] = plan->CommPerStep().Total();
    if (stage > 0) {
      padding = std::max(padding, static_cast<double>(plan->padded_numel() - plan->total_numel()) /
                                      static_cast<double>(plan->total_numel()));
    }
  }
  // 2 * 63/64 * Psi * 2 bytes for the all-reduce (stage 0 pads only to the alignment).
  EXPECT_NEAR(static_cast<double>(volume[0]), 2.0 * 63 / 64 * 7.5e9 * 2, 7.5e9 * 1e-5);
  // Stages 1-3 move their padded segments: equal to stage 0 (1.5x at stage 3) up to that padding.
  EXPECT_GT(padding, 0);
  EXPECT_LT(padding, 1e-4);
  EXPECT_NEAR(static_cast<double>(volume[1]) / volume[0], 1.0, 1.01 * padding);
  EXPECT_NEAR(static_cast<double>(volume[2]) / volume[0], 1.0, 1.01 * padding);
  EXPECT_NEAR(static_cast<double>(volume[3]) / volume[0], 1.5, 1.5 * 1.01 * padding);
}

TEST(ShardPlan, OneRankCommunicatesNothing) {
  auto plan = ShardPlan::Create(Input({T("a", {1000})}, 1, 3));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->CommPerStep().Total(), 0);
}

TEST(ShardPlan, FindTensorByName) {
  auto plan = ShardPlan::Create(Input({T("a", {3}), T("b", {4})}, 2, 1));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->FindTensor("b"), 1);
  EXPECT_FALSE(plan->FindTensor("c").has_value());
}

TEST(ShardPlan, DigestIsPinned) {
  // Changing the digest's byte layout breaks every stored plan: this value must not move.
  auto plan = ShardPlan::Create(Input({T("w", {4, 4}), T("b", {4})}, 2, 2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->DigestHex(), "28231523d194e5a3");
  EXPECT_EQ(DigestHex(LayoutDigest(plan->tensors())), "c91dcf6378b64d5c");
}

TEST(ShardPlan, DigestSeesEveryInput) {
  const PlanInput base = Input({T("w", {4, 4}), T("b", {4})}, 2, 2);
  const uint64_t d = ShardPlan::Create(base)->digest();
  PlanInput other = base;
  other.options.world_size = 3;
  EXPECT_NE(ShardPlan::Create(other)->digest(), d);
  other = base;
  other.options.stage = 3;
  EXPECT_NE(ShardPlan::Create(other)->digest(), d);
  other = base;
  other.tensors[1].shape = {5};
  EXPECT_NE(ShardPlan::Create(other)->digest(), d);
  other = base;
  other.tensors[0].name = "w2";
  EXPECT_NE(ShardPlan::Create(other)->digest(), d);
  other = base;
  other.options.reduce_bucket_bytes = 1 << 10;
  EXPECT_NE(ShardPlan::Create(other)->digest(), d);
  other = base;
  other.options.budget_bytes = 1ll << 40;  // the budget chooses a stage, it is not the plan
  EXPECT_EQ(ShardPlan::Create(other)->digest(), d);
}

TEST(ValidatePlanInput, NamesTheFieldAtFault) {
  auto message = [](PlanInput in) {
    auto plan = ShardPlan::Create(std::move(in));
    EXPECT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(plan.status().message());
  };
  EXPECT_THAT(message(Input({}, 2, 1)), HasSubstr("no tensors"));
  EXPECT_THAT(message(Input({T("a", {3}), T("a", {4})}, 2, 1)), HasSubstr("'a'"));
  EXPECT_THAT(message(Input({T("a", {3, -4})}, 2, 1)), HasSubstr("shape[1]"));
  EXPECT_THAT(message(Input({T("a", {0})}, 2, 1)), HasSubstr("no elements"));
  EXPECT_THAT(message(Input({T("a", {3})}, 0, 1)), HasSubstr("world size"));
  EXPECT_THAT(message(Input({T("a", {3})}, 2, 4)), HasSubstr("stage"));
  EXPECT_THAT(message(Input({T("", {3})}, 2, 1)), HasSubstr("no name"));
  EXPECT_THAT(message(Input({T("a", {1ll << 40, 1ll << 40})}, 2, 1)), HasSubstr("too many"));
  PlanInput live = Input({T("a", {3})}, 2, 3);
  live.options.prefetch_depth = 2;
  live.options.max_live_units = 2;
  EXPECT_THAT(message(live), HasSubstr("max live units"));
}

// Found by tests/fuzz/plan_inputs_fuzz: a layout under the old 2^62-element cap (one tensor of
// 2^61 elements), a bucket or gather buffer count in the billions, or padding to 2^24 ranks x
// 2^20 alignment on many segments made the bytes a rank allocates overflow int64 (UBSan; in the
// daemon's BuildPlan, a negative allocated_bytes_per_rank stored with the plan).
TEST(ValidatePlanInput, RefusesWhatWouldOverflowTheBytesARankAllocates) {
  auto message = [](PlanInput in) {
    auto plan = ShardPlan::Create(std::move(in));
    EXPECT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(plan.status().message());
  };
  EXPECT_THAT(message(Input({T("wte", {(1ll << 53) + (1ll << 49) - 1, 16, 16})}, 1, 0)),
              HasSubstr("more than 2^48"));
  PlanInput buckets = Input({T("a", {3})}, 2, 2);
  buckets.options.bucket_buffers = 1ll << 60;
  EXPECT_THAT(message(buckets), HasSubstr("bucket buffers: must be 1..1024"));
  PlanInput units = Input({T("a", {3})}, 2, 3);
  units.options.max_live_units = 1ll << 60;
  EXPECT_THAT(message(units), HasSubstr("max live units: must be at most 1024"));
  // prefetch + 1 overflowed where the live-unit rule was checked (plan_inputs_fuzz too).
  PlanInput prefetch = Input({T("a", {3})}, 2, 3);
  prefetch.options.prefetch_depth = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(message(prefetch), HasSubstr("prefetch depth: must be 0..1023"));
  std::vector<TensorSpec> many;
  for (int i = 0; i < 64; ++i) many.push_back(T("t" + std::to_string(i), {1}));
  PlanInput padded = Input(many, 1 << 24, 1);
  padded.options.partition_alignment_numel = 1 << 20;
  padded.options.reduce_bucket_bytes = 1;  // every tensor its own segment, padded to 2^44
  EXPECT_THAT(message(padded), HasSubstr("padded"));

  // The largest of everything that is allowed still counts its bytes exactly.
  PlanInput largest = Input({T("a", {1ll << 47}), T("b", {1ll << 47})}, 1, 3);
  largest.options.param_dtype = DType::kFloat32;
  largest.options.grad_dtype = DType::kFloat32;
  largest.options.bucket_buffers = 1024;
  largest.options.max_live_units = 1024;
  auto plan = ShardPlan::Create(largest);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->AllocatedBytesPerRank(), 0);
  EXPECT_EQ(plan->MemoryForRank(0).Total(), plan->AllocatedBytesPerRank());
}

}  // namespace
}  // namespace zerod::plan
