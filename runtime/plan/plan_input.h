#ifndef ZEROD_RUNTIME_PLAN_PLAN_INPUT_H_
#define ZEROD_RUNTIME_PLAN_PLAN_INPUT_H_

// The inputs of a shard plan: the model's parameter layout and the partitioning options. These,
// not the plan, are what the coordinator stores and sends; every rank recomputes the same
// ShardPlan from them (DESIGN.md: the plan travels small).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/common/dtype.h"

namespace zerod::plan {

// One parameter tensor, in model order. `unit` optionally names the stage-3 gather unit: a run of
// consecutive tensors with the same non-empty label forms one unit. When no tensor has a label,
// units are formed by size (PlanOptions::gather_unit_bytes).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty shape = scalar (one element)
  DType dtype = DType::kBFloat16;
  std::string unit;

  int64_t numel() const;
};

// ZeRO stage: 0 = plain data parallel, 1 = optimizer state partitioned, 2 = + gradients,
// 3 = + parameters. kAutoStage asks for the lowest stage whose memory fits every budget.
inline constexpr int kAutoStage = -1;

enum class Optimizer : uint8_t { kAdam = 0, kAdamW = 1 };

struct PlanOptions {
  int64_t world_size = 1;
  int stage = kAutoStage;
  DType param_dtype = DType::kBFloat16;
  DType grad_dtype = DType::kBFloat16;
  Optimizer optimizer = Optimizer::kAdam;
  // Every rank's slice of a segment is a multiple of this many elements, so shards start on
  // 64-byte boundaries for fp32 vector kernels and 16-byte boundaries for NCCL.
  int64_t partition_alignment_numel = 16;
  // Gradients are reduced in buckets of whole consecutive tensors up to this size (a larger tensor
  // is a bucket of its own).
  int64_t reduce_bucket_bytes = 64ll << 20;
  // Full-size gradient buckets kept at once (one filling while one is in flight).
  int64_t bucket_buffers = 2;
  // Stage 3: consecutive tensors grouped into gather units up to this size, unless labelled.
  int64_t gather_unit_bytes = 64ll << 20;
  // Stage 3: units gathered ahead of use, and the most units materialised at once.
  int64_t prefetch_depth = 1;
  int64_t max_live_units = 2;
  // Memory budget per rank in bytes; empty = unbounded. For kAutoStage the smallest one decides.
  std::optional<int64_t> budget_bytes;
};

struct PlanInput {
  std::vector<TensorSpec> tensors;
  PlanOptions options;
};

// The most elements a plan takes, padding included: every byte count of a plan then fits int64.
inline constexpr int64_t kMaxPlanNumel = int64_t{1} << 48;

// Checks everything a plan needs: at least one tensor, unique non-empty names, non-negative
// dimensions, a total of at most kMaxPlanNumel, world size >= 1, a known stage, positive sizes,
// at most 1024 bucket buffers and live units. The error names the field or tensor at fault.
absl::Status ValidatePlanInput(const PlanInput& input);

}  // namespace zerod::plan

#endif  // ZEROD_RUNTIME_PLAN_PLAN_INPUT_H_
