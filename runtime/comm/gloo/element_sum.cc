#include "runtime/comm/gloo/element_sum.h"

#include <cstdint>

#include "runtime/common/half.h"

namespace zerod::comm::internal {
namespace {

template <typename ToFloat, typename Back>
void SumHalf(void* out, const void* a, const void* b, size_t n, ToFloat to_float, Back back) {
  auto* c = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) c[i] = back(to_float(x[i]) + to_float(y[i]));
}

}  // namespace

void ElementSum(DType dtype, void* out, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* c = static_cast<float*>(out);
      const auto* x = static_cast<const float*>(a);
      const auto* y = static_cast<const float*>(b);
      for (size_t i = 0; i < n; ++i) c[i] = x[i] + y[i];
      return;
    }
    case DType::kBFloat16:
      return SumHalf(out, a, b, n, Bf16ToFloat, FloatToBf16);
    case DType::kFloat16:
      return SumHalf(out, a, b, n, Fp16ToFloat, FloatToFp16);
  }
}

}  // namespace zerod::comm::internal
