#ifndef ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_H_
#define ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_H_

#include <cstddef>

#include "runtime/common/dtype.h"

namespace zerod::comm::internal {

// out[i] = a[i] + b[i] for `n` elements of `dtype`; bf16 and fp16 round to the element type after
// every addition, as NCCL does. `out` may be `a` or `b`. Addition commutes bit for bit, so only
// the order in which several inputs are added decides the result. The 16-bit sums run on AVX2 +
// F16C where the CPU has both (HaveAvx2Sums), with the same bits as the scalar loop; kScalar asks
// for the scalar loop (tests compare the two).
enum class SumIsa { kBest, kScalar };
void ElementSum(DType dtype, void* out, const void* a, const void* b, size_t n,
                SumIsa isa = SumIsa::kBest);
bool HaveAvx2Sums();

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_H_
