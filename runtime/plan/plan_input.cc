#include "runtime/plan/plan_input.h"

#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zerod::plan {
namespace {

// Caps that keep every byte count of a plan inside int64: a rank allocates at most 20 bytes per
// padded element of model state, plus kMaxBufferCount bucket and gather buffers of up to 4 bytes
// per element of the largest segment: with 2^48 elements, under 2^62. (2^48 elements is 280
// trillion parameters; 1024 buffers is hundreds of times what anyone configures.)
constexpr int64_t kMaxNumel = kMaxPlanNumel;
constexpr int64_t kMaxBufferCount = 1024;

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status ValidatePlanInput(const PlanInput& input) {
  const PlanOptions& o = input.options;
  if (input.tensors.empty()) return Invalid("layout", "has no tensors");
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(input.tensors.size());
  int64_t total = 0;
  for (size_t i = 0; i < input.tensors.size(); ++i) {
    const TensorSpec& t = input.tensors[i];
    const std::string where =
        absl::StrCat("tensor ", i, t.name.empty() ? "" : " '", t.name, t.name.empty() ? "" : "'");
    if (t.name.empty()) return Invalid(where, "has no name");
    if (!names.insert(t.name).second) return Invalid(where, "name appears twice");
    int64_t numel = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      const int64_t dim = t.shape[d];
      if (dim < 0) {
        return Invalid(where, absl::StrCat("shape[", d, "] is negative (", dim, ")"));
      }
      if (dim != 0 && numel > kMaxNumel / dim) {
        return Invalid(where, "has too many elements (more than 2^48)");
      }
      numel *= dim;
    }
    if (total > kMaxNumel - numel) return Invalid("layout", "has more than 2^48 elements");
    total += numel;
  }
  if (total == 0) return Invalid("layout", "has no elements (every tensor is empty)");
  if (o.world_size < 1) {
    return Invalid("world size", absl::StrCat("must be at least 1, got ", o.world_size));
  }
  if (o.world_size > (int64_t{1} << 24)) {
    return Invalid("world size", absl::StrCat("must be at most 2^24, got ", o.world_size));
  }
  if (o.stage != kAutoStage && (o.stage < 0 || o.stage > 3)) {
    return Invalid("stage", absl::StrCat("must be 0, 1, 2, 3 or auto, got ", o.stage));
  }
  if (o.partition_alignment_numel < 1 || o.partition_alignment_numel > (1 << 20)) {
    return Invalid("partition alignment",
                   absl::StrCat("must be 1..2^20 elements, got ", o.partition_alignment_numel));
  }
  if (o.reduce_bucket_bytes < 1) {
    return Invalid("reduce bucket size",
                   absl::StrCat("must be positive, got ", o.reduce_bucket_bytes));
  }
  if (o.bucket_buffers < 1 || o.bucket_buffers > kMaxBufferCount) {
    return Invalid("bucket buffers",
                   absl::StrCat("must be 1..", kMaxBufferCount, ", got ", o.bucket_buffers));
  }
  if (o.gather_unit_bytes < 1) {
    return Invalid("gather unit size", absl::StrCat("must be positive, got ", o.gather_unit_bytes));
  }
  // Below the live-unit cap, which it must stay under anyway; and prefetch + 1 cannot overflow.
  if (o.prefetch_depth < 0 || o.prefetch_depth >= kMaxBufferCount) {
    return Invalid("prefetch depth",
                   absl::StrCat("must be 0..", kMaxBufferCount - 1, ", got ", o.prefetch_depth));
  }
  if (o.max_live_units > kMaxBufferCount) {
    return Invalid("max live units",
                   absl::StrCat("must be at most ", kMaxBufferCount, ", got ", o.max_live_units));
  }
  if (o.max_live_units < o.prefetch_depth + 1) {
    return Invalid("max live units",
                   absl::StrCat("must be at least prefetch depth + 1 (", o.prefetch_depth + 1,
                                "), got ", o.max_live_units));
  }
  if (o.budget_bytes.has_value() && *o.budget_bytes <= 0) {
    return Invalid("budget", absl::StrCat("must be positive, got ", *o.budget_bytes));
  }
  return absl::OkStatus();
}

}  // namespace zerod::plan
