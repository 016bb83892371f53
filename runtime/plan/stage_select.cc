// ShardPlan::Create: validation, `auto` stage selection against the memory budget, and the advice
// a budget error carries (which stage, world size or budget would fit).

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/common/units.h"
#include "runtime/plan/shard_plan.h"

namespace zerod::plan {
namespace {

constexpr int64_t kMaxWorldSize = int64_t{1} << 24;

using Layout = std::shared_ptr<const std::vector<TensorSpec>>;

absl::StatusOr<int64_t> BytesAt(const Layout& layout, PlanOptions options, int stage,
                                int64_t world_size) {
  options.world_size = world_size;
  ZEROD_ASSIGN_OR_RETURN(ShardPlan plan, BuildPlanForStage(layout, options, stage));
  return plan.AllocatedBytesPerRank();
}

// Smallest world size above options.world_size where stage 3 fits `budget`, or 0 when none up to
// kMaxWorldSize does. Stage 3's bytes per rank fall as ranks grow, apart from the padding that
// rounds every unit up to ranks x alignment, so a doubling search brackets the answer and a
// bisection finds it.
absl::StatusOr<int64_t> SmallestWorldSizeForStage3(const Layout& layout, const PlanOptions& options,
                                                   int64_t budget) {
  int64_t too_small = options.world_size;
  int64_t fits = 0;
  for (int64_t w = options.world_size * 2;; w *= 2) {
    if (w > kMaxWorldSize) w = kMaxWorldSize;
    ZEROD_ASSIGN_OR_RETURN(int64_t bytes, BytesAt(layout, options, 3, w));
    if (bytes <= budget) {
      fits = w;
      break;
    }
    too_small = w;
    if (w == kMaxWorldSize) return 0;
  }
  while (fits - too_small > 1) {
    const int64_t mid = too_small + (fits - too_small) / 2;
    ZEROD_ASSIGN_OR_RETURN(int64_t bytes, BytesAt(layout, options, 3, mid));
    (bytes <= budget ? fits : too_small) = mid;
  }
  return fits;
}

// RESOURCE_EXHAUSTED for a plan over budget; says what would fit.
absl::Status OverBudget(const Layout& layout, const PlanOptions& options, int requested_stage) {
  const int64_t budget = *options.budget_bytes;
  const int64_t w = options.world_size;
  std::string message;
  if (requested_stage == kAutoStage) {
    message = absl::StrCat("no ZeRO stage fits the budget of ", FormatBytes(budget),
                           " per rank at ", w, " ranks");
  } else {
    ZEROD_ASSIGN_OR_RETURN(int64_t need, BytesAt(layout, options, requested_stage, w));
    message = absl::StrCat("stage ", requested_stage, " needs ", FormatBytes(need), " per rank at ",
                           w, " ranks, over the budget of ", FormatBytes(budget));
    for (int s = requested_stage + 1; s <= 3; ++s) {
      ZEROD_ASSIGN_OR_RETURN(int64_t bytes, BytesAt(layout, options, s, w));
      if (bytes <= budget) {
        return absl::ResourceExhaustedError(
            absl::StrCat(message, "; stage ", s, " fits (", FormatBytes(bytes), " per rank)"));
      }
    }
  }
  ZEROD_ASSIGN_OR_RETURN(int64_t stage3, BytesAt(layout, options, 3, w));
  if (requested_stage != 3) {
    absl::StrAppend(&message, "; stage 3 needs ", FormatBytes(stage3), " per rank");
  }
  ZEROD_ASSIGN_OR_RETURN(int64_t ranks, SmallestWorldSizeForStage3(layout, options, budget));
  if (ranks > 0) {
    absl::StrAppend(&message, "; stage 3 fits at ", ranks, " ranks or more, or with a budget of ",
                    FormatBytes(stage3), " per rank at ", w, " ranks");
  } else {
    absl::StrAppend(&message, "; stage 3 does not fit at any world size up to ", kMaxWorldSize,
                    " (bucket and gather buffers alone take that much): use smaller gather "
                    "units or buckets, or a budget of ",
                    FormatBytes(stage3));
  }
  return absl::ResourceExhaustedError(message);
}

}  // namespace

absl::StatusOr<ShardPlan> ShardPlan::Create(PlanInput input) {
  ZEROD_RETURN_IF_ERROR(ValidatePlanInput(input));
  const PlanOptions options = input.options;
  Layout layout = std::make_shared<const std::vector<TensorSpec>>(std::move(input.tensors));
  const auto fits = [&](const ShardPlan& plan) {
    return !options.budget_bytes.has_value() ||
           plan.AllocatedBytesPerRank() <= *options.budget_bytes;
  };
  if (options.stage != kAutoStage) {
    ZEROD_ASSIGN_OR_RETURN(ShardPlan plan, BuildPlanForStage(layout, options, options.stage));
    if (fits(plan)) return plan;
    return OverBudget(layout, options, options.stage);
  }
  // Lowest stage first: it communicates least.
  for (int stage = 0; stage <= 3; ++stage) {
    ZEROD_ASSIGN_OR_RETURN(ShardPlan plan, BuildPlanForStage(layout, options, stage));
    if (fits(plan)) return plan;
  }
  return OverBudget(layout, options, kAutoStage);
}

}  // namespace zerod::plan
