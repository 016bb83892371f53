// ElementSum for bf16 and fp16 on AVX2 + F16C: 16 elements per iteration, converted, added in
// float and rounded back exactly as the scalar loop does (half_avx2.h). Built with -mavx2 -mf16c,
// called only where the CPU has both. Rings and inline collectives sum every chunk they receive:
// scalar, the 16-bit sums took longer than the transfers they followed.

#include "runtime/comm/gloo/element_sum_avx2.h"

#include "runtime/common/half.h"
#include "runtime/common/half_avx2.h"

namespace zerod::comm::internal {

void SumBf16Avx2(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a0, a1, b0, b1;
    avx2::LoadBf16x16(a + i, &a0, &a1);
    avx2::LoadBf16x16(b + i, &b0, &b1);
    avx2::StoreBf16x16(out + i, _mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1));
  }
  for (; i < n; ++i) out[i] = FloatToBf16(Bf16ToFloat(a[i]) + Bf16ToFloat(b[i]));
}

void SumFp16Avx2(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 s0 = _mm256_add_ps(avx2::LoadFp16x8(a + i), avx2::LoadFp16x8(b + i));
    const __m256 s1 = _mm256_add_ps(avx2::LoadFp16x8(a + i + 8), avx2::LoadFp16x8(b + i + 8));
    avx2::StoreFp16x8(out + i, s0);
    avx2::StoreFp16x8(out + i + 8, s1);
  }
  for (; i < n; ++i) out[i] = FloatToFp16(Fp16ToFloat(a[i]) + Fp16ToFloat(b[i]));
}

}  // namespace zerod::comm::internal
