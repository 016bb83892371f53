// AVX2 Adam: 8 floats per iteration; the same operations as AdamElement. Built with -mavx2
// -mf16c (no FMA contraction), called only when the CPU has them.

#include <immintrin.h>

#include "runtime/optim/internal/adam_element.h"

namespace zerod::optim::internal {
namespace {

inline __m256 LoadGrad8(const AdamShard& s, int64_t i) {
  switch (s.grad_dtype) {
    case DType::kFloat32:
      return _mm256_loadu_ps(static_cast<const float*>(s.grad) + i);
    case DType::kBFloat16: {
      const __m128i h = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(s.grad) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case DType::kFloat16:
      return _mm256_cvtph_ps(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(s.grad) + i)));
  }
  return _mm256_setzero_ps();
}

inline __m128i ToBf16x8(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256 is_nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  rounded = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(is_nan));
  rounded = _mm256_and_si256(rounded, _mm256_set1_epi32(0xffff));
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}

}  // namespace

void AdamAvx2(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end) {
  const __m256 multiplier = _mm256_set1_ps(k.grad_multiplier);
  const __m256 decay = _mm256_set1_ps(k.decay_factor);
  const __m256 wd = _mm256_set1_ps(k.weight_decay);
  const __m256 beta1 = _mm256_set1_ps(k.beta1), one_minus_beta1 = _mm256_set1_ps(k.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(k.beta2), one_minus_beta2 = _mm256_set1_ps(k.one_minus_beta2);
  const __m256 bias2_sqrt = _mm256_set1_ps(k.bias2_sqrt), eps = _mm256_set1_ps(k.eps);
  const __m256 neg_step = _mm256_set1_ps(-k.step_size);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    // Four streams defeat some hardware prefetchers; ask for the lines 1 KiB ahead.
    _mm_prefetch(reinterpret_cast<const char*>(s.param + i + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s.exp_avg + i + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s.exp_avg_sq + i + 256), _MM_HINT_T0);
    __m256 g = _mm256_mul_ps(LoadGrad8(s, i), multiplier);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(s.param + i), decay);
    g = _mm256_add_ps(g, _mm256_mul_ps(wd, p));
    __m256 m = _mm256_mul_ps(_mm256_loadu_ps(s.exp_avg + i), beta1);
    m = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta1, g));
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s.exp_avg_sq + i), beta2);
    v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bias2_sqrt), eps);
    p = _mm256_add_ps(p, _mm256_mul_ps(neg_step, _mm256_div_ps(m, denom)));
    _mm256_storeu_ps(s.param + i, p);
    _mm256_storeu_ps(s.exp_avg + i, m);
    _mm256_storeu_ps(s.exp_avg_sq + i, v);
    if (s.low_precision != nullptr) {
      auto* out = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(s.low_precision) + i);
      _mm_storeu_si128(out, s.low_precision_dtype == DType::kFloat16
                                ? _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT)
                                : ToBf16x8(p));
    }
  }
  for (; i < end; ++i) AdamElement(s, k, i);
}

}  // namespace zerod::optim::internal
