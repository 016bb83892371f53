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

}  // namespace

int64_t ShardPlan::OptimizerBytesPerParam() const {
  const bool mixed = options_.param_dtype != DType::kFloat32;
  return (mixed ? kFp32Bytes : 0) + 2 * kFp32Bytes;
}

std::vector<Allocation> ShardPlan::Allocations() const {
  const int64_t pb = DTypeBytes(options_.param_dtype);
  const int64_t gb = DTypeBytes(options_.grad_dtype);
  const bool shard_params = stage_ == 3;
  const bool shard_grads = stage_ >= 2;
  const bool shard_optimizer = stage_ >= 1;
  auto length = [&](bool sharded) { return sharded ? shard_numel_ : padded_numel_; };

  std::vector<Allocation> out;
  out.push_back({"params", MemoryCategory::kParams, 1, length(shard_params), pb, shard_params});
  out.push_back({"grads", MemoryCategory::kGrads, 1, length(shard_grads), gb, shard_grads});
  if (options_.param_dtype != DType::kFloat32) {
    out.push_back({"master", MemoryCategory::kMaster, 1, length(shard_optimizer), kFp32Bytes,
                   shard_optimizer});
  }
  out.push_back(
      {"adam_m", MemoryCategory::kAdamM, 1, length(shard_optimizer), kFp32Bytes, shard_optimizer});
  out.push_back(
      {"adam_v", MemoryCategory::kAdamV, 1, length(shard_optimizer), kFp32Bytes, shard_optimizer});
  if (shard_grads) {
    // Full-size gradients of a bucket live here until its reduce-scatter lands in the shard.
    out.push_back({"bucket", MemoryCategory::kBucketBuffers, options_.bucket_buffers,
                   max_segment_numel_, gb, false});
  }
  if (shard_params) {
    out.push_back({"gather", MemoryCategory::kGatherBuffers, options_.max_live_units,
                   max_segment_numel_, pb, false});
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
    const int64_t real = (a.sharded ? owned_real : total_numel_) * a.element_bytes * a.count;
    m[a.category] += real;
    m[MemoryCategory::kPadding] += a.bytes() - real;
  }
  return m;
}

MemoryBreakdownPaper ShardPlan::PaperBytes() const {
  const double psi = static_cast<double>(total_numel_);
  const double per_rank = psi / static_cast<double>(options_.world_size);
  const bool mixed = options_.param_dtype != DType::kFloat32;
  const double optimizer = stage_ >= 1 ? per_rank : psi;
  MemoryBreakdownPaper paper{};
  paper[static_cast<int>(MemoryCategory::kParams)] =
      static_cast<double>(DTypeBytes(options_.param_dtype)) * (stage_ == 3 ? per_rank : psi);
  paper[static_cast<int>(MemoryCategory::kGrads)] =
      static_cast<double>(DTypeBytes(options_.grad_dtype)) * (stage_ >= 2 ? per_rank : psi);
  paper[static_cast<int>(MemoryCategory::kMaster)] = mixed ? kFp32Bytes * optimizer : 0.0;
  paper[static_cast<int>(MemoryCategory::kAdamM)] = kFp32Bytes * optimizer;
  paper[static_cast<int>(MemoryCategory::kAdamV)] = kFp32Bytes * optimizer;
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
