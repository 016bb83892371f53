#include "runtime/comm/gloo/element_sum.h"

#include <cstdint>

#include "runtime/comm/gloo/element_sum_avx2.h"
#include "runtime/common/cpu_features.h"
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

bool HaveAvx2Sums() {
  static const bool have = __builtin_cpu_supports("avx2") && CpuHasF16c();
  return have;
}

void ElementSum(DType dtype, void* out, const void* a, const void* b, size_t n, SumIsa isa) {
  const bool vector = isa == SumIsa::kBest && HaveAvx2Sums();
  auto* c = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  switch (dtype) {
    case DType::kFloat32: {
      auto* cf = static_cast<float*>(out);
      const auto* xf = static_cast<const float*>(a);
      const auto* yf = static_cast<const float*>(b);
      for (size_t i = 0; i < n; ++i) cf[i] = xf[i] + yf[i];  // vectorised by the compiler
      return;
    }
    case DType::kBFloat16:
      if (vector) return SumBf16Avx2(c, x, y, n);
      return SumHalf(out, a, b, n, Bf16ToFloat, FloatToBf16);
    case DType::kFloat16:
      if (vector) return SumFp16Avx2(c, x, y, n);
      return SumHalf(out, a, b, n, Fp16ToFloat, FloatToFp16);
  }
}

}  // namespace zerod::comm::internal
