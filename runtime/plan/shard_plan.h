#ifndef ZEROD_RUNTIME_PLAN_SHARD_PLAN_H_
#define ZEROD_RUNTIME_PLAN_SHARD_PLAN_H_

// ShardPlan: how one model's training state is partitioned across data-parallel ranks.
//
// The parameters form one padded flat buffer, cut into segments of whole consecutive tensors: the
// reduce buckets at stages 0-2, the gather units at stage 3 ("bucket" and "unit" are what a
// segment is called where it is reduced or gathered; the index is the same). Each segment is
// padded to a multiple of (ranks x alignment) and split into equal slices, rank r owning slice r
// of every segment, so every collective is an even reduce-scatter or all-gather of one segment. A
// rank's shard is its slices laid end to end: all shards have the same length. At stage 0 nothing
// is partitioned and every rank holds every segment whole (one slice, the segment).
//
// Where a slice sits depends on the buffer holding it (BufferLayout); SliceOf is the one place
// that rule is written, and OwnedRange::OffsetIn reads it for a given layout.
//
// The plan holds O(tensors + segments) numbers; pieces of a tensor and a rank's ranges are
// computed when asked, never materialised as tensors x ranks. A plan is immutable and cheap to
// copy (the layout is shared).

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/plan/plan_input.h"

namespace zerod::plan {

struct Segment {
  int64_t first_tensor = 0;
  int64_t tensor_count = 0;
  int64_t flat_offset = 0;   // start in the padded flat buffer
  int64_t numel = 0;         // real elements
  int64_t padded_numel = 0;  // numel rounded up to partition_ways x alignment
  int64_t slice_numel = 0;   // padded_numel / partition_ways: one rank's part
  int64_t shard_offset = 0;  // where each rank's slice starts inside its shard
};

// What a buffer holds of the flat parameter space, which decides where an element sits in it.
enum class BufferLayout : int {
  kFlat,     // every segment whole, at its flat_offset: padded_numel() elements
  kShard,    // one rank's slice of every segment, end to end: shard_numel() elements
  kSegment,  // one segment whole, at 0 (a bucket or gather buffer): up to max_segment_numel()
};

struct TensorPlacement {
  int64_t flat_offset = 0;  // in the padded flat buffer
  int64_t numel = 0;
  int64_t segment = 0;
  int64_t segment_offset = 0;  // in its segment: where it sits in a kSegment buffer
};

// Owner of a piece at stage 0, where every rank holds everything.
inline constexpr int64_t kReplicated = -1;

// A run of one tensor's elements held by one rank.
struct Piece {
  int64_t owner_rank = 0;     // or kReplicated
  int64_t shard_offset = 0;   // in the owner's shard
  int64_t tensor_offset = 0;  // in the tensor, flattened
  int64_t numel = 0;
};

// One rank's slice of one segment, located in every layout.
struct OwnedRange {
  int64_t segment = 0;
  int64_t flat_offset = 0;     // in the padded flat buffer (kFlat)
  int64_t shard_offset = 0;    // in the rank's shard (kShard)
  int64_t numel = 0;           // slice length, padding included
  int64_t real_numel = 0;      // elements that belong to tensors
  int64_t segment_offset = 0;  // in the segment (kSegment): rank x numel, 0 at stage 0

  // Where the slice starts in a buffer of `layout`.
  int64_t OffsetIn(BufferLayout layout) const;
};

enum class MemoryCategory : int {
  kParams = 0,     // low-precision (or fp32) parameters
  kGrads,          // gradients
  kMaster,         // fp32 master parameters (mixed precision only)
  kAdamM,          // Adam first moment
  kAdamV,          // Adam second moment
  kPadding,        // alignment and partition padding inside the buffers above
  kBucketBuffers,  // full-size gradient buckets awaiting reduce-scatter
  kGatherBuffers,  // stage-3 all-gathered parameter units
};
inline constexpr int kMemoryCategoryCount = 8;
absl::string_view MemoryCategoryName(MemoryCategory c);

struct MemoryBreakdown {
  std::array<int64_t, kMemoryCategoryCount> bytes{};

  int64_t& operator[](MemoryCategory c) { return bytes[static_cast<int>(c)]; }
  int64_t operator[](MemoryCategory c) const { return bytes[static_cast<int>(c)]; }
  // Sum of every category.
  int64_t Total() const;
  // Parameters, gradients and optimizer state that hold real elements (no padding, no buffers).
  int64_t ModelState() const;
};

// The paper's figure per category (padding and buffers are 0): fractional at Psi / Nd.
using MemoryBreakdownPaper = std::array<double, kMemoryCategoryCount>;

// One buffer a rank allocates; the engine allocates exactly these.
struct Allocation {
  absl::string_view name;  // "params", "grads", "master", "adam_m", "adam_v", "bucket", "gather"
  MemoryCategory category = MemoryCategory::kParams;
  int64_t count = 1;  // identical buffers of this kind
  int64_t numel = 0;  // elements per buffer
  int64_t element_bytes = 0;
  BufferLayout layout = BufferLayout::kFlat;

  int64_t bytes() const { return count * numel * element_bytes; }
  // Holds one slice per segment rather than whole segments.
  bool sharded() const { return layout == BufferLayout::kShard; }
};

// Bytes one rank sends per optimizer step, by collective (ring algorithms: a reduce-scatter or
// all-gather of n elements over W ranks sends (W-1)/W * n, an all-reduce twice that).
struct CommVolume {
  int64_t all_reduce_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t all_gather_bytes = 0;

  int64_t Total() const { return all_reduce_bytes + reduce_scatter_bytes + all_gather_bytes; }
};

class ShardPlan {
 public:
  // Validates `input` and builds the plan. With stage kAutoStage it picks the lowest stage whose
  // allocation fits options.budget_bytes (stage 0 when there is no budget). A plan that does not
  // fit the budget is RESOURCE_EXHAUSTED, naming what would fit (stage, world size or budget).
  static absl::StatusOr<ShardPlan> Create(PlanInput input);

  int stage() const { return stage_; }
  const PlanOptions& options() const { return options_; }
  int64_t world_size() const { return options_.world_size; }
  // Ranks a segment is split across: world size, or 1 at stage 0.
  int64_t partition_ways() const { return stage_ == 0 ? 1 : options_.world_size; }

  const std::vector<TensorSpec>& tensors() const { return *tensors_; }
  const std::vector<TensorPlacement>& placements() const { return placements_; }
  const std::vector<Segment>& segments() const { return segments_; }
  // Reduce buckets are the segments at every stage; gather units exist at stage 3 only (they are
  // the segments there too).
  const std::vector<Segment>& reduce_buckets() const { return segments_; }
  bool has_gather_units() const { return stage_ == 3; }

  int64_t total_numel() const { return total_numel_; }    // real elements, the paper's Psi
  int64_t padded_numel() const { return padded_numel_; }  // flat buffer length
  int64_t shard_numel() const { return shard_numel_; }    // every rank's shard length
  int64_t max_segment_numel() const { return max_segment_numel_; }

  // Index of the tensor called `name`, if any.
  std::optional<int64_t> FindTensor(absl::string_view name) const;
  // The pieces of tensor `index`, in tensor order; they cover it exactly once.
  std::vector<Piece> Pieces(int64_t tensor_index) const;
  // Rank `rank`'s slice of segment `segment`: where every flat, shard and segment offset of a
  // slice comes from.
  OwnedRange SliceOf(int64_t rank, int64_t segment) const;
  // Rank `rank`'s slices, one per segment, in shard order.
  std::vector<OwnedRange> OwnedRanges(int64_t rank) const;
  // Real (non-padding) elements in `rank`'s shard.
  int64_t OwnedRealNumel(int64_t rank) const;

  // The buffers every rank allocates (same sizes on every rank).
  std::vector<Allocation> Allocations() const;
  // Sum of Allocations(): what a rank really holds for model state.
  int64_t AllocatedBytesPerRank() const;
  // `rank`'s allocations split by category; Total() equals AllocatedBytesPerRank().
  MemoryBreakdown MemoryForRank(int64_t rank) const;
  // The ZeRO paper's model-state bytes per rank: (p + g + K) Psi split as the stage says, with
  // fractional Psi / Nd. Excludes padding and buffers. PaperBytes() splits it by category.
  double PaperModelStateBytes() const;
  MemoryBreakdownPaper PaperBytes() const;
  // Bytes of optimizer state per parameter: K = 12 with mixed precision, 8 in fp32 training.
  int64_t OptimizerBytesPerParam() const;

  CommVolume CommPerStep() const;

  // Stable across runs, machines and call order: 64-bit XXH3 of the canonical inputs and the
  // resolved stage; DigestHex() spells it as 16 hex digits.
  uint64_t digest() const { return digest_; }
  std::string DigestHex() const;

 private:
  friend absl::StatusOr<ShardPlan> BuildPlanForStage(
      std::shared_ptr<const std::vector<TensorSpec>> tensors, const PlanOptions& options,
      int stage);

  ShardPlan() = default;

  std::shared_ptr<const std::vector<TensorSpec>> tensors_;
  PlanOptions options_;
  int stage_ = 0;
  std::vector<TensorPlacement> placements_;
  std::vector<Segment> segments_;
  int64_t total_numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t shard_numel_ = 0;
  int64_t max_segment_numel_ = 0;
  uint64_t digest_ = 0;
};

// Builds the plan for one fixed stage, ignoring the budget. Inputs must already be valid
// (ValidatePlanInput). Used by ShardPlan::Create and by stage selection's what-if searches.
absl::StatusOr<ShardPlan> BuildPlanForStage(std::shared_ptr<const std::vector<TensorSpec>> tensors,
                                            const PlanOptions& options, int stage);

}  // namespace zerod::plan

#endif  // ZEROD_RUNTIME_PLAN_SHARD_PLAN_H_
