#ifndef ZEROD_RUNTIME_PLAN_INTERNAL_SEGMENTER_H_
#define ZEROD_RUNTIME_PLAN_INTERNAL_SEGMENTER_H_

#include <cstdint>
#include <vector>

#include "runtime/plan/plan_input.h"

namespace zerod::plan::internal {

struct TensorGroup {
  int64_t first_tensor = 0;
  int64_t tensor_count = 0;
};

// Cuts the layout into runs of whole consecutive tensors, in model order.
// Stages 0-2: reduce buckets of at most reduce_bucket_bytes of gradients, filled from the last
// tensor back (the order backward produces gradients), a larger tensor alone.
// Stage 3: gather units, by the tensors' `unit` labels when any tensor has one (an unlabelled
// tensor is a unit of its own), otherwise filled from the first tensor up to gather_unit_bytes.
std::vector<TensorGroup> GroupTensors(const std::vector<TensorSpec>& tensors,
                                      const PlanOptions& options, int stage);

}  // namespace zerod::plan::internal

#endif  // ZEROD_RUNTIME_PLAN_INTERNAL_SEGMENTER_H_
