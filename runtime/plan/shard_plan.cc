#include "runtime/plan/shard_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/internal/segmenter.h"

namespace zerod::plan {
namespace {

int64_t RoundUp(int64_t n, int64_t quantum) { return (n + quantum - 1) / quantum * quantum; }

}  // namespace

absl::string_view MemoryCategoryName(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParams:
      return "params";
    case MemoryCategory::kGrads:
      return "grads";
    case MemoryCategory::kMaster:
      return "master";
    case MemoryCategory::kAdamM:
      return "adam_m";
    case MemoryCategory::kAdamV:
      return "adam_v";
    case MemoryCategory::kPadding:
      return "padding";
    case MemoryCategory::kBucketBuffers:
      return "bucket_buffers";
    case MemoryCategory::kGatherBuffers:
      return "gather_buffers";
  }
  return "unknown";
}

int64_t MemoryBreakdown::Total() const {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return sum;
}

int64_t MemoryBreakdown::ModelState() const {
  return (*this)[MemoryCategory::kParams] + (*this)[MemoryCategory::kGrads] +
         (*this)[MemoryCategory::kMaster] + (*this)[MemoryCategory::kAdamM] +
         (*this)[MemoryCategory::kAdamV];
}

absl::StatusOr<ShardPlan> BuildPlanForStage(std::shared_ptr<const std::vector<TensorSpec>> tensors,
                                            const PlanOptions& options, int stage) {
  ShardPlan plan;
  plan.tensors_ = std::move(tensors);
  plan.options_ = options;
  plan.options_.stage = stage;
  plan.stage_ = stage;
  const std::vector<TensorSpec>& specs = *plan.tensors_;

  const int64_t quantum = plan.partition_ways() * options.partition_alignment_numel;
  const std::vector<internal::TensorGroup> groups = internal::GroupTensors(specs, options, stage);
  plan.segments_.reserve(groups.size());
  plan.placements_.resize(specs.size());
  int64_t flat = 0;
  int64_t shard = 0;
  for (const internal::TensorGroup& g : groups) {
    Segment seg;
    seg.first_tensor = g.first_tensor;
    seg.tensor_count = g.tensor_count;
    seg.flat_offset = flat;
    const int64_t segment_index = static_cast<int64_t>(plan.segments_.size());
    for (int64_t i = g.first_tensor; i < g.first_tensor + g.tensor_count; ++i) {
      const int64_t numel = specs[i].numel();
      plan.placements_[i] = {flat + seg.numel, numel, segment_index, seg.numel};
      seg.numel += numel;
    }
    seg.padded_numel = RoundUp(seg.numel, quantum);
    // Padding every segment to ranks x alignment can grow a valid layout past the cap; checked
    // before it is added, so that no sum overflows (both terms are at most 2^48 + 2^44).
    if (seg.padded_numel > kMaxPlanNumel - flat) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout padded to ", plan.partition_ways(), " ranks x alignment ",
                       options.partition_alignment_numel, " has more than 2^48 elements"));
    }
    seg.slice_numel = seg.padded_numel / plan.partition_ways();
    seg.shard_offset = shard;
    flat += seg.padded_numel;
    shard += seg.slice_numel;
    plan.total_numel_ += seg.numel;
    plan.max_segment_numel_ = std::max(plan.max_segment_numel_, seg.padded_numel);
    plan.segments_.push_back(seg);
  }
  plan.padded_numel_ = flat;
  plan.shard_numel_ = shard;
  plan.digest_ = PlanDigest(specs, plan.options_, stage);
  return plan;
}

std::optional<int64_t> ShardPlan::FindTensor(absl::string_view name) const {
  for (size_t i = 0; i < tensors_->size(); ++i) {
    if ((*tensors_)[i].name == name) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

int64_t OwnedRange::OffsetIn(BufferLayout layout) const {
  switch (layout) {
    case BufferLayout::kFlat:
      return flat_offset;
    case BufferLayout::kShard:
      return shard_offset;
    case BufferLayout::kSegment:
      return segment_offset;
  }
  return flat_offset;
}

OwnedRange ShardPlan::SliceOf(int64_t rank, int64_t segment) const {
  const Segment& seg = segments_.at(static_cast<size_t>(segment));
  // At stage 0 every rank's one slice is the whole segment.
  const int64_t start = (stage_ == 0 ? 0 : rank) * seg.slice_numel;
  OwnedRange r;
  r.segment = segment;
  r.flat_offset = seg.flat_offset + start;
  r.shard_offset = seg.shard_offset;
  r.numel = seg.slice_numel;
  r.real_numel = std::clamp(seg.numel - start, int64_t{0}, seg.slice_numel);
  r.segment_offset = start;
  return r;
}

std::vector<Piece> ShardPlan::Pieces(int64_t tensor_index) const {
  const TensorPlacement& p = placements_.at(static_cast<size_t>(tensor_index));
  const int64_t slice_numel = segments_[static_cast<size_t>(p.segment)].slice_numel;
  const int64_t begin = p.segment_offset;
  const int64_t end = begin + p.numel;
  std::vector<Piece> pieces;
  if (p.numel == 0) return pieces;
  // Slice r of a segment covers [r x slice_numel, (r + 1) x slice_numel) of it; at stage 0 the
  // one slice is the whole segment, so the loop runs once.
  for (int64_t r = begin / slice_numel; r <= (end - 1) / slice_numel; ++r) {
    const OwnedRange slice = SliceOf(r, p.segment);
    const int64_t lo = std::max(begin, slice.segment_offset);
    const int64_t hi = std::min(end, slice.segment_offset + slice.numel);
    pieces.push_back({stage_ == 0 ? kReplicated : r,
                      slice.shard_offset + (lo - slice.segment_offset), lo - begin, hi - lo});
  }
  return pieces;
}

std::vector<OwnedRange> ShardPlan::OwnedRanges(int64_t rank) const {
  std::vector<OwnedRange> ranges;
  ranges.reserve(segments_.size());
  for (size_t k = 0; k < segments_.size(); ++k) {
    ranges.push_back(SliceOf(rank, static_cast<int64_t>(k)));
  }
  return ranges;
}

int64_t ShardPlan::OwnedRealNumel(int64_t rank) const {
  int64_t real = 0;
  for (size_t k = 0; k < segments_.size(); ++k) {
    real += SliceOf(rank, static_cast<int64_t>(k)).real_numel;
  }
  return real;
}

std::string ShardPlan::DigestHex() const { return plan::DigestHex(digest_); }

}  // namespace zerod::plan
