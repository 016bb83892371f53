#include "runtime/plan/shard_plan.h"

#include <algorithm>
#include <utility>

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
      plan.placements_[i] = {flat + seg.numel, numel, segment_index};
      seg.numel += numel;
    }
    seg.padded_numel = RoundUp(seg.numel, quantum);
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

std::vector<Piece> ShardPlan::Pieces(int64_t tensor_index) const {
  const TensorPlacement& p = placements_.at(static_cast<size_t>(tensor_index));
  const Segment& seg = segments_[static_cast<size_t>(p.segment)];
  const int64_t begin = p.flat_offset - seg.flat_offset;  // within the segment
  const int64_t end = begin + p.numel;
  std::vector<Piece> pieces;
  if (p.numel == 0) return pieces;
  if (stage_ == 0) {
    pieces.push_back({kReplicated, seg.shard_offset + begin, 0, p.numel});
    return pieces;
  }
  const int64_t s = seg.slice_numel;
  for (int64_t r = begin / s; r <= (end - 1) / s; ++r) {
    const int64_t lo = std::max(begin, r * s);
    const int64_t hi = std::min(end, (r + 1) * s);
    pieces.push_back({r, seg.shard_offset + (lo - r * s), lo - begin, hi - lo});
  }
  return pieces;
}

std::vector<OwnedRange> ShardPlan::OwnedRanges(int64_t rank) const {
  std::vector<OwnedRange> ranges;
  ranges.reserve(segments_.size());
  const int64_t slot = stage_ == 0 ? 0 : rank;
  for (size_t k = 0; k < segments_.size(); ++k) {
    const Segment& seg = segments_[k];
    const int64_t start = slot * seg.slice_numel;
    const int64_t real = std::clamp(seg.numel - start, int64_t{0}, seg.slice_numel);
    ranges.push_back({static_cast<int64_t>(k), seg.flat_offset + start, seg.shard_offset,
                      seg.slice_numel, real});
  }
  return ranges;
}

int64_t ShardPlan::OwnedRealNumel(int64_t rank) const {
  const int64_t slot = stage_ == 0 ? 0 : rank;
  int64_t real = 0;
  for (const Segment& seg : segments_) {
    real += std::clamp(seg.numel - slot * seg.slice_numel, int64_t{0}, seg.slice_numel);
  }
  return real;
}

std::string ShardPlan::DigestHex() const { return plan::DigestHex(digest_); }

}  // namespace zerod::plan
