#ifndef ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_AVX2_H_
#define ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_AVX2_H_

#include <cstddef>
#include <cstdint>

namespace zerod::comm::internal {

// ElementSum's 16-bit loops on AVX2 + F16C, bit for bit the scalar ones; call only where
// HaveAvx2Sums() (element_sum.cc) says the CPU has both. `out` may be `a` or `b`.
void SumBf16Avx2(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n);
void SumFp16Avx2(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n);

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_ELEMENT_SUM_AVX2_H_
