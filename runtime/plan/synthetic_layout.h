#ifndef ZEROD_RUNTIME_PLAN_SYNTHETIC_LAYOUT_H_
#define ZEROD_RUNTIME_PLAN_SYNTHETIC_LAYOUT_H_

// A stand-in layout for planning by parameter count alone (`zeroctl plan --params 7.5B`) and for
// benchmarks: `min(params, tensor_count)` one-dimensional tensors named "param.N" whose sizes
// differ by at most one element and add up to `params`.

#include <cstdint>
#include <vector>

#include "runtime/plan/plan_input.h"

namespace zerod::plan {

inline constexpr int64_t kSyntheticTensorCount = 1024;

std::vector<TensorSpec> SyntheticLayout(int64_t params, DType dtype,
                                        int64_t tensor_count = kSyntheticTensorCount);

}  // namespace zerod::plan

#endif  // ZEROD_RUNTIME_PLAN_SYNTHETIC_LAYOUT_H_
