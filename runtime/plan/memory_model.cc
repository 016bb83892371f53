// ShardPlan's memory and communication accounting: which buffers a rank allocates, how their
// bytes split into the paper's categories, padding and buffers, and what a step sends.

#include <cmath>

#include "runtime/plan/shard_plan.h"

namespace zerod::plan {
namespace {

constexpr int64_t kFp32Bytes = 4;

bool IsModelState(MemoryCategory c) {
  return c == MemoryCategory::kParams || c == MemoryCategory::kGrads ||
         c == MemoryCategory::kMaster || c == MemoryCategory::kAdamM || c == MemoryCategory::kAdamV;
}

// What each stage partitions: optimizer state from stage 1, gradients from 2, parameters at 3;
// bucket and gather buffers hold one segment whole.
BufferLayout LayoutOf(MemoryCategory c, int stage) {
  switch (c) {
    case MemoryCategory::kParams:
      return stage == 3 ? BufferLayout::kShard : BufferLayout::kFlat;
    case MemoryCategory::kGrads:
      return stage >= 2 ? BufferLayout::kShard : BufferLayout::kFlat;
    case MemoryCategory::kMaster:
    case MemoryCategory::kAdamM:
    case MemoryCategory::kAdamV:
      return stage >= 1 ? BufferLayout::kShard : BufferLayout::kFlat;
    case MemoryCategory::kBucketBuffers:
    case MemoryCategory::kGatherBuffers:
      return BufferLayout::kSegment;
    case MemoryCategory::kPadding:
      break;
  }
  return BufferLayout::kFlat;
}

}  // namespace

int64_t ShardPlan::OptimizerBytesPerParam() const {
  const bool mixed = options_.param_dtype != DType::kFloat32;
  return (mixed ? kFp32Bytes : 0) + 2 * kFp32Bytes;
}

std::vector<Allocation> ShardPlan::Allocations() const {
  const int64_t pb = DTypeBytes(options_.param_dtype);
  const int64_t gb = DTypeBytes(options_.grad_dtype);
  auto planned = [&](absl::string_view name, MemoryCategory c, int64_t count,
                     int64_t element_bytes) {
    const BufferLayout layout = LayoutOf(c, stage_);
    const int64_t numel = layout == BufferLayout::kShard     ? shard_numel_
                          : layout == BufferLayout::kSegment ? max_segment_numel_
                                                             : padded_numel_;
    return Allocation{name, c, count, numel, element_bytes, layout};
  };

  std::vector<Allocation> out;
  out.push_back(planned("params", MemoryCategory::kParams, 1, pb));
  out.push_back(planned("grads", MemoryCategory::kGrads, 1, gb));
  if (options_.param_dtype != DType::kFloat32) {
    out.push_back(planned("master", MemoryCategory::kMaster, 1, kFp32Bytes));
  }
  out.push_back(planned("adam_m", MemoryCategory::kAdamM, 1, kFp32Bytes));
  out.push_back(planned("adam_v", MemoryCategory::kAdamV, 1, kFp32Bytes));
  if (stage_ >= 2) {
    // Full-size gradients of a bucket live here until its reduce-scatter lands in the shard.
    out.push_back(planned("bucket", MemoryCategory::kBucketBuffers, options_.bucket_buffers, gb));
  }
  if (stage_ == 3) {
    out.push_back(planned("gather", MemoryCategory::kGatherBuffers, options_.max_live_units, pb));
  }
  return out;
}

int64_t ShardPlan::AllocatedBytesPerRank() const {
  int64_t total = 0;
  for (const Allocation& a : Allocations()) total += a.bytes();
  return total;
}

MemoryBreakdown ShardPlan::MemoryForRank(int64_t rank) const {
  const int64_t owned_real = OwnedRealNumel(rank);
  MemoryBreakdown m;
  for (const Allocation& a : Allocations()) {
    if (!IsModelState(a.category)) {
      m[a.category] += a.bytes();
      continue;
    }
    const int64_t real = (a.sharded() ? owned_real : total_numel_) * a.element_bytes * a.count;
    m[a.category] += real;
    m[MemoryCategory::kPadding] += a.bytes() - real;
  }
  return m;
}

MemoryBreakdownPaper ShardPlan::PaperBytes() const {
  const double psi = static_cast<double>(total_numel_);
  const double per_rank = psi / static_cast<double>(options_.world_size);
  const bool mixed = options_.param_dtype != DType::kFloat32;
  auto elements = [&](MemoryCategory c) {
    return LayoutOf(c, stage_) == BufferLayout::kShard ? per_rank : psi;
  };
  MemoryBreakdownPaper paper{};
  paper[static_cast<int>(MemoryCategory::kParams)] =
      static_cast<double>(DTypeBytes(options_.param_dtype)) * elements(MemoryCategory::kParams);
  paper[static_cast<int>(MemoryCategory::kGrads)] =
      static_cast<double>(DTypeBytes(options_.grad_dtype)) * elements(MemoryCategory::kGrads);
  paper[static_cast<int>(MemoryCategory::kMaster)] =
      mixed ? kFp32Bytes * elements(MemoryCategory::kMaster) : 0.0;
  paper[static_cast<int>(MemoryCategory::kAdamM)] = kFp32Bytes * elements(MemoryCategory::kAdamM);
  paper[static_cast<int>(MemoryCategory::kAdamV)] = kFp32Bytes * elements(MemoryCategory::kAdamV);
  return paper;
}

double ShardPlan::PaperModelStateBytes() const {
  double sum = 0;
  for (double b : PaperBytes()) sum += b;
  return sum;
}

CommVolume ShardPlan::CommPerStep() const {
  CommVolume v;
  const int64_t w = options_.world_size;
  if (w == 1) return v;
  const int64_t pb = DTypeBytes(options_.param_dtype);
  const int64_t gb = DTypeBytes(options_.grad_dtype);
  if (stage_ == 0) {
    // Ring all-reduce of the whole gradient buffer: a reduce-scatter plus an all-gather.
    v.all_reduce_bytes =
        std::llround(2.0 * static_cast<double>(w - 1) * static_cast<double>(padded_numel_ * gb) /
                     static_cast<double>(w));
    return v;
  }
  // Each rank sends W-1 slices of every segment per reduce-scatter or all-gather.
  v.reduce_scatter_bytes = (w - 1) * shard_numel_ * gb;
  // Stages 1-2 gather updated parameters once; stage 3 gathers each unit for forward and again
  // for backward.
  v.all_gather_bytes = (stage_ == 3 ? 2 : 1) * (w - 1) * shard_numel_ * pb;
  return v;
}

}  // namespace zerod::plan
