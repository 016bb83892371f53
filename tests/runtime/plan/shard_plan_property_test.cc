// Properties every plan must have, over random layouts and world sizes 1..1024 (primes, sizes
// larger than whole tensors, and empty tensors included): pieces cover each tensor exactly once
// and agree with the owners' ranges; slices sit where the segment arithmetic says in every
// layout; shards are equal, disjoint and cover the padded buffer;
// totals are the sum of their categories; the digest is stable.

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/plan/shard_plan.h"

namespace zerod::plan {
namespace {

std::vector<TensorSpec> RandomLayout(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> count(1, 40);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int64_t> small(0, 7);
  std::uniform_int_distribution<int64_t> medium(1, 3000);
  std::vector<TensorSpec> tensors;
  const int n = count(rng);
  for (int i = 0; i < n; ++i) {
    TensorSpec t;
    t.name = "t" + std::to_string(i);
    const int k = kind(rng);
    if (k < 3) {
      t.shape = {small(rng)};  // smaller than most world sizes, sometimes empty
    } else if (k < 8) {
      t.shape = {medium(rng), small(rng) + 1};
    } else if (k == 8) {
      t.shape = {};  // scalar
    } else {
      t.shape = {medium(rng) * 7};
    }
    t.unit = (rng() % 4 == 0) ? "u" + std::to_string(i / 3) : "";
    tensors.push_back(std::move(t));
  }
  return tensors;
}

int64_t RandomWorldSize(std::mt19937_64& rng) {
  static const int64_t kInteresting[] = {1,  2,  3,  4,   5,   7,   8,    13,
                                         31, 64, 97, 128, 257, 509, 1021, 1024};
  if (rng() % 2 == 0) return kInteresting[rng() % std::size(kInteresting)];
  return 1 + static_cast<int64_t>(rng() % 1024);
}

PlanOptions RandomOptions(std::mt19937_64& rng, int64_t world, int stage) {
  PlanOptions o;
  o.world_size = world;
  o.stage = stage;
  o.partition_alignment_numel = int64_t{1} << (rng() % 5);
  o.reduce_bucket_bytes = 64 + static_cast<int64_t>(rng() % 20000);
  o.gather_unit_bytes = 64 + static_cast<int64_t>(rng() % 20000);
  o.param_dtype = static_cast<DType>(rng() % 3);
  o.grad_dtype = static_cast<DType>(rng() % 3);
  o.optimizer = static_cast<Optimizer>(rng() % 2);
  return o;
}

void CheckPiecesCoverEachTensorOnce(const ShardPlan& plan) {
  const int64_t w = plan.partition_ways();
  for (int64_t i = 0; i < static_cast<int64_t>(plan.tensors().size()); ++i) {
    const TensorPlacement& place = plan.placements()[i];
    const Segment& seg = plan.segments()[place.segment];
    int64_t covered = 0;
    for (const Piece& p : plan.Pieces(i)) {
      ASSERT_EQ(p.tensor_offset, covered) << "tensor " << i << ": gap or overlap";
      ASSERT_GT(p.numel, 0);
      // The piece lies inside its owner's slice of the tensor's segment, at the same flat place.
      const int64_t slot = plan.stage() == 0 ? 0 : p.owner_rank;
      ASSERT_TRUE(plan.stage() == 0 ? p.owner_rank == kReplicated
                                    : (p.owner_rank >= 0 && p.owner_rank < w));
      const int64_t in_slice = p.shard_offset - seg.shard_offset;
      ASSERT_GE(in_slice, 0);
      ASSERT_LE(in_slice + p.numel, seg.slice_numel);
      ASSERT_EQ(seg.flat_offset + slot * seg.slice_numel + in_slice,
                place.flat_offset + p.tensor_offset);
      covered += p.numel;
    }
    ASSERT_EQ(covered, plan.tensors()[i].numel()) << "tensor " << i;
  }
}

void CheckShardsPartitionTheBuffer(const ShardPlan& plan) {
  const int64_t w = plan.world_size();
  struct Span {
    int64_t begin, end;
  };
  std::vector<Span> spans;
  int64_t real = 0;
  for (int64_t r = 0; r < w; ++r) {
    int64_t length = 0, next_shard_offset = 0;
    for (const OwnedRange& range : plan.OwnedRanges(r)) {
      ASSERT_EQ(range.shard_offset, next_shard_offset) << "shard of rank " << r << " has a hole";
      next_shard_offset += range.numel;
      length += range.numel;
      if (plan.stage() > 0 || r == 0)
        spans.push_back({range.flat_offset, range.flat_offset + range.numel});
    }
    ASSERT_EQ(length, plan.shard_numel()) << "rank " << r;
    if (plan.stage() > 0) real += plan.OwnedRealNumel(r);
  }
  std::sort(spans.begin(), spans.end(), [](Span a, Span b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    ASSERT_EQ(s.begin, at) << "shards overlap or leave a gap at " << at;
    at = s.end;
  }
  ASSERT_EQ(at, plan.padded_numel());
  if (plan.stage() > 0) {
    ASSERT_EQ(real, plan.total_numel()) << "real elements are owned exactly once";
    ASSERT_EQ(plan.shard_numel() * w, plan.padded_numel());
  } else {
    ASSERT_EQ(plan.shard_numel(), plan.padded_numel());
  }
  for (const Segment& seg : plan.segments()) {
    ASSERT_EQ(seg.padded_numel % (plan.partition_ways() * plan.options().partition_alignment_numel),
              0);
  }
}

// SliceOf, OwnedRanges, placements and allocations agree with the segment arithmetic written out
// here: slice r of a segment is its elements [r x slice, (r + 1) x slice), at shard_offset in r's
// shard; at stage 0 the one slice is the whole segment.
void CheckSlicesInEveryLayout(const ShardPlan& plan) {
  const int64_t w = plan.world_size();
  for (int64_t r : {int64_t{0}, w / 2, w - 1}) {
    const std::vector<OwnedRange> ranges = plan.OwnedRanges(r);
    ASSERT_EQ(ranges.size(), plan.segments().size());
    for (size_t k = 0; k < ranges.size(); ++k) {
      const Segment& seg = plan.segments()[k];
      const OwnedRange slice = plan.SliceOf(r, static_cast<int64_t>(k));
      const int64_t start = (plan.stage() == 0 ? 0 : r) * seg.slice_numel;
      ASSERT_EQ(slice.segment, static_cast<int64_t>(k));
      ASSERT_EQ(slice.segment_offset, start);
      ASSERT_EQ(slice.flat_offset, seg.flat_offset + start);
      ASSERT_EQ(slice.shard_offset, seg.shard_offset);
      ASSERT_EQ(slice.numel, seg.slice_numel);
      ASSERT_EQ(slice.real_numel, std::clamp(seg.numel - start, int64_t{0}, seg.slice_numel));
      ASSERT_EQ(slice.OffsetIn(BufferLayout::kFlat), slice.flat_offset);
      ASSERT_EQ(slice.OffsetIn(BufferLayout::kShard), slice.shard_offset);
      ASSERT_EQ(slice.OffsetIn(BufferLayout::kSegment), slice.segment_offset);
      const OwnedRange& listed = ranges[k];
      ASSERT_EQ(listed.flat_offset, slice.flat_offset);
      ASSERT_EQ(listed.shard_offset, slice.shard_offset);
      ASSERT_EQ(listed.segment_offset, slice.segment_offset);
      ASSERT_EQ(listed.real_numel, slice.real_numel);
    }
  }
  for (const TensorPlacement& place : plan.placements()) {
    const Segment& seg = plan.segments()[static_cast<size_t>(place.segment)];
    ASSERT_EQ(place.segment_offset, place.flat_offset - seg.flat_offset);
    ASSERT_GE(place.segment_offset, 0);
    ASSERT_LE(place.segment_offset + place.numel, seg.numel);
  }
  const int stage = plan.stage();
  for (const Allocation& a : plan.Allocations()) {
    bool want_shard = false;
    if (a.category == MemoryCategory::kParams) want_shard = stage == 3;
    if (a.category == MemoryCategory::kGrads) want_shard = stage >= 2;
    if (a.category == MemoryCategory::kMaster || a.category == MemoryCategory::kAdamM ||
        a.category == MemoryCategory::kAdamV) {
      want_shard = stage >= 1;
    }
    const bool one_segment = a.category == MemoryCategory::kBucketBuffers ||
                             a.category == MemoryCategory::kGatherBuffers;
    ASSERT_EQ(a.sharded(), want_shard) << a.name;
    ASSERT_EQ(a.layout == BufferLayout::kSegment, one_segment) << a.name;
    ASSERT_EQ(a.numel, one_segment  ? plan.max_segment_numel()
                       : want_shard ? plan.shard_numel()
                                    : plan.padded_numel())
        << a.name;
  }
}

void CheckTotals(const ShardPlan& plan) {
  const int64_t allocated = plan.AllocatedBytesPerRank();
  const int64_t w = plan.world_size();
  for (int64_t r : {int64_t{0}, w / 2, w - 1}) {
    const MemoryBreakdown m = plan.MemoryForRank(r);
    for (int64_t b : m.bytes) ASSERT_GE(b, 0);
    ASSERT_EQ(m.Total(), allocated) << "rank " << r;
    ASSERT_EQ(m.ModelState() + m[MemoryCategory::kPadding] + m[MemoryCategory::kBucketBuffers] +
                  m[MemoryCategory::kGatherBuffers],
              allocated);
  }
  const CommVolume c = plan.CommPerStep();
  ASSERT_EQ(c.Total(), c.all_reduce_bytes + c.reduce_scatter_bytes + c.all_gather_bytes);
}

TEST(ShardPlanProperties, RandomLayoutsAndWorldSizes) {
  std::mt19937_64 rng(20240917);
  int plans = 0;
  for (int iteration = 0; iteration < 150; ++iteration) {
    const std::vector<TensorSpec> layout = RandomLayout(rng);
    const int64_t world = RandomWorldSize(rng);
    for (int stage = 0; stage <= 3; ++stage) {
      PlanInput input{layout, RandomOptions(rng, world, stage)};
      auto plan = ShardPlan::Create(input);
      if (!plan.ok()) {
        // Only an all-empty layout may be refused.
        int64_t total = 0;
        for (const TensorSpec& t : layout) total += t.numel();
        ASSERT_EQ(total, 0) << plan.status();
        continue;
      }
      SCOPED_TRACE("iteration " + std::to_string(iteration) + " world " + std::to_string(world) +
                   " stage " + std::to_string(stage));
      ASSERT_NO_FATAL_FAILURE(CheckPiecesCoverEachTensorOnce(*plan));
      ASSERT_NO_FATAL_FAILURE(CheckShardsPartitionTheBuffer(*plan));
      ASSERT_NO_FATAL_FAILURE(CheckSlicesInEveryLayout(*plan));
      ASSERT_NO_FATAL_FAILURE(CheckTotals(*plan));
      // Same inputs, same digest, whatever ran in between.
      auto again = ShardPlan::Create(input);
      ASSERT_EQ(again->digest(), plan->digest());
      ++plans;
    }
  }
  EXPECT_GT(plans, 500);
}

TEST(ShardPlanProperties, DigestIgnoresUnrelatedCallsAndOrder) {
  std::mt19937_64 rng(7);
  const std::vector<TensorSpec> a = RandomLayout(rng);
  const std::vector<TensorSpec> b = RandomLayout(rng);
  PlanInput in_a{a, RandomOptions(rng, 97, 3)};
  PlanInput in_b{b, RandomOptions(rng, 13, 2)};
  const uint64_t first_a = ShardPlan::Create(in_a)->digest();
  const uint64_t first_b = ShardPlan::Create(in_b)->digest();
  auto plan_b = ShardPlan::Create(in_b);
  (void)plan_b->Pieces(0);
  (void)plan_b->MemoryForRank(5);
  EXPECT_EQ(ShardPlan::Create(in_b)->digest(), first_b);
  EXPECT_EQ(ShardPlan::Create(in_a)->digest(), first_a);
}

TEST(ShardPlanProperties, MoreRanksThanElements) {
  PlanInput in;
  in.tensors = {{"tiny", {3}, DType::kFloat32, ""}, {"b", {1}, DType::kFloat32, ""}};
  in.options.world_size = 1021;
  for (int stage = 1; stage <= 3; ++stage) {
    in.options.stage = stage;
    auto plan = ShardPlan::Create(in);
    ASSERT_TRUE(plan.ok());
    ASSERT_NO_FATAL_FAILURE(CheckPiecesCoverEachTensorOnce(*plan));
    ASSERT_NO_FATAL_FAILURE(CheckShardsPartitionTheBuffer(*plan));
    EXPECT_EQ(plan->OwnedRealNumel(1020), 0);
  }
}

}  // namespace
}  // namespace zerod::plan
