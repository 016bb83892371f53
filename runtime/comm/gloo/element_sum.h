#ifndef ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_H_
#define ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_H_

#include <cstddef>

#include "runtime/common/dtype.h"

namespace zerod::comm::internal {

// out[i] = a[i] + b[i] for `n` elements of `dtype`; bf16 and fp16 round to the element type after
// every addition, as NCCL does. `out` may be `a` or `b`. Addition commutes bit for bit, so only
// the order in which several inputs are added decides the result.
void ElementSum(DType dtype, void* out, const void* a, const void* b, size_t n);

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_H_
