#ifndef ZEROD_RUNTIME_COMMON_HALF_AVX2_H_
#define ZEROD_RUNTIME_COMMON_HALF_AVX2_H_

// half.h's conversions on eight lanes at once, bit for bit the same. Only for files built with
// -mavx2 -mf16c, whose code runs only where the CPU has both (checked at run time).

#include <immintrin.h>

#include <cstdint>

namespace zerod::avx2 {

// Bf16ToFloat on 16 values, p[0..8) into *lo and p[8..16) into *hi: one load, one permute and two
// interleaves with zero (a bf16 placed above 16 zero bits is its float), where 8 at a time
// took two loads, two widenings and two shifts.
inline void LoadBf16x16(const uint16_t* p, __m256* lo, __m256* hi) {
  // Lanes [0..3, 8..11 | 4..7, 12..15]: the in-lane interleaves then give [0..7] and [8..15].
  const __m256i g = _mm256_permute4x64_epi64(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i zero = _mm256_setzero_si256();
  *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, g));
  *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, g));
}

// FloatToBf16 on 8 floats, each result in the low half of its 32-bit lane (the high half zero):
// round to nearest even by adding 0x7fff plus the kept part's lowest bit, except that NaN keeps
// its top bits and becomes quiet. No overflow: the largest non-NaN pattern, -inf, has room.
inline __m256i Bf16Lanes(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256 is_nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(is_nan));
}

// Bf16Lanes of floats none of which is NaN: the rounding alone (the lowest kept bit taken by two
// shifts, so no mask constant takes one of AVX2's 16 registers).
inline __m256i Bf16LanesOfNumbers(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_srli_epi32(_mm256_slli_epi32(u, 15), 31);
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
                           16);
}

// FloatToBf16 on 16 floats (p0 then p1), stored at `out`.
inline void StoreBf16x16(uint16_t* out, __m256 p0, __m256 p1) {
  // One comparison tells whether any of the 16 is NaN (unordered: either operand NaN); without a
  // NaN, which is every time in training that goes well, the rounding needs 5 operations a
  // vector instead of 8.
  const __m256 any_nan = _mm256_cmp_ps(p0, p1, _CMP_UNORD_Q);
  const bool numbers = _mm256_testz_ps(any_nan, any_nan);
  // Every lane is at most 0xffff, so the saturating pack is exact; it interleaves the 128-bit
  // halves (p0 lo, p1 lo, p0 hi, p1 hi), which the permute puts back in order.
  const __m256i packed = __builtin_expect(numbers, 1)
                             ? _mm256_packus_epi32(Bf16LanesOfNumbers(p0), Bf16LanesOfNumbers(p1))
                             : _mm256_packus_epi32(Bf16Lanes(p0), Bf16Lanes(p1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
}

// Fp16ToFloat and FloatToFp16 on 8 values: F16C, exact one way and rounding to nearest even the
// other, as the scalar versions do.
inline __m256 LoadFp16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void StoreFp16x8(uint16_t* out, __m256 p) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace zerod::avx2

#endif  // ZEROD_RUNTIME_COMMON_HALF_AVX2_H_
