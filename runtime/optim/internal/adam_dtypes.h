#ifndef ZEROD_RUNTIME_OPTIM_INTERNAL_ADAM_DTYPES_H_
#define ZEROD_RUNTIME_OPTIM_INTERNAL_ADAM_DTYPES_H_

// The dtype combinations the vector kernels are compiled for, and the one switch that picks the
// instantiation for a shard: a loop per combination keeps the dtype tests out of the inner loop.

#include <type_traits>

#include "runtime/optim/adam.h"

namespace zerod::optim::internal {

// The low-precision copy a step writes, if any.
enum class Copy { kNone, kBf16, kFp16 };

template <DType kGrad>
using GradTag = std::integral_constant<DType, kGrad>;
template <Copy kCopy>
using CopyTag = std::integral_constant<Copy, kCopy>;

// Calls loop(GradTag<...>{}, CopyTag<...>{}) for `s`'s gradient dtype and copy. A copy dtype other
// than fp16 is bf16, as in AdamElement.
template <typename Loop>
void ForShardDtypes(const AdamShard& s, Loop&& loop) {
  auto with_copy = [&](auto grad) {
    if (s.low_precision == nullptr) {
      loop(grad, CopyTag<Copy::kNone>{});
    } else if (s.low_precision_dtype == DType::kFloat16) {
      loop(grad, CopyTag<Copy::kFp16>{});
    } else {
      loop(grad, CopyTag<Copy::kBf16>{});
    }
  };
  switch (s.grad_dtype) {
    case DType::kFloat32:
      return with_copy(GradTag<DType::kFloat32>{});
    case DType::kBFloat16:
      return with_copy(GradTag<DType::kBFloat16>{});
    case DType::kFloat16:
      return with_copy(GradTag<DType::kFloat16>{});
  }
}

}  // namespace zerod::optim::internal

#endif  // ZEROD_RUNTIME_OPTIM_INTERNAL_ADAM_DTYPES_H_
