#include "runtime/plan/internal/segmenter.h"

#include <algorithm>

namespace zerod::plan::internal {
namespace {

// Greedy fill over tensors [0, n) visited in `forward` or reverse order: a tensor joins the open
// group while the group stays within `limit_bytes`; an empty group always takes it.
std::vector<TensorGroup> GroupBySize(const std::vector<TensorSpec>& tensors, int64_t element_bytes,
                                     int64_t limit_bytes, bool forward) {
  std::vector<TensorGroup> groups;
  const int64_t n = static_cast<int64_t>(tensors.size());
  int64_t open_bytes = 0;
  for (int64_t step = 0; step < n; ++step) {
    const int64_t i = forward ? step : n - 1 - step;
    const int64_t bytes = tensors[i].numel() * element_bytes;
    if (groups.empty() || open_bytes + bytes > limit_bytes) {
      groups.push_back({i, 0});
      open_bytes = 0;
    }
    TensorGroup& g = groups.back();
    if (!forward) g.first_tensor = i;
    ++g.tensor_count;
    open_bytes += bytes;
  }
  if (!forward) std::reverse(groups.begin(), groups.end());
  return groups;
}

std::vector<TensorGroup> GroupByLabel(const std::vector<TensorSpec>& tensors) {
  std::vector<TensorGroup> groups;
  for (int64_t i = 0; i < static_cast<int64_t>(tensors.size()); ++i) {
    const std::string& label = tensors[i].unit;
    const bool joins = !groups.empty() && !label.empty() && tensors[i - 1].unit == label;
    if (joins) {
      ++groups.back().tensor_count;
    } else {
      groups.push_back({i, 1});
    }
  }
  return groups;
}

}  // namespace

std::vector<TensorGroup> GroupTensors(const std::vector<TensorSpec>& tensors,
                                      const PlanOptions& options, int stage) {
  if (stage == 3) {
    const bool labelled = std::any_of(tensors.begin(), tensors.end(),
                                      [](const TensorSpec& t) { return !t.unit.empty(); });
    if (labelled) return GroupByLabel(tensors);
    return GroupBySize(tensors, DTypeBytes(options.param_dtype), options.gather_unit_bytes,
                       /*forward=*/true);
  }
  return GroupBySize(tensors, DTypeBytes(options.grad_dtype), options.reduce_bucket_bytes,
                     /*forward=*/false);
}

}  // namespace zerod::plan::internal
