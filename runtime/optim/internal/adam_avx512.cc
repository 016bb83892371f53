// AVX-512 Adam: 16 floats per iteration; the same operations as AdamElement. Built with
// -mavx512f -mavx512bw, called only when the CPU has them.

#include <immintrin.h>

#include "runtime/optim/internal/adam_element.h"

namespace zerod::optim::internal {
namespace {

inline __m512 LoadGrad16(const AdamShard& s, int64_t i) {
  switch (s.grad_dtype) {
    case DType::kFloat32:
      return _mm512_loadu_ps(static_cast<const float*>(s.grad) + i);
    case DType::kBFloat16: {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(s.grad) + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case DType::kFloat16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(s.grad) + i)));
  }
  return _mm512_setzero_ps();
}

inline __m256i ToBf16x16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  rounded = _mm512_mask_blend_epi32(is_nan, rounded, nan);
  return _mm512_cvtepi32_epi16(rounded);
}

}  // namespace

void AdamAvx512(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end) {
  const __m512 multiplier = _mm512_set1_ps(k.grad_multiplier);
  const __m512 decay = _mm512_set1_ps(k.decay_factor);
  const __m512 wd = _mm512_set1_ps(k.weight_decay);
  const __m512 beta1 = _mm512_set1_ps(k.beta1), one_minus_beta1 = _mm512_set1_ps(k.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(k.beta2), one_minus_beta2 = _mm512_set1_ps(k.one_minus_beta2);
  const __m512 bias2_sqrt = _mm512_set1_ps(k.bias2_sqrt), eps = _mm512_set1_ps(k.eps);
  const __m512 neg_step = _mm512_set1_ps(-k.step_size);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    // Four streams defeat some hardware prefetchers; ask for the lines 1 KiB ahead.
    _mm_prefetch(reinterpret_cast<const char*>(s.param + i + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s.exp_avg + i + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s.exp_avg_sq + i + 256), _MM_HINT_T0);
    __m512 g = _mm512_mul_ps(LoadGrad16(s, i), multiplier);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(s.param + i), decay);
    g = _mm512_add_ps(g, _mm512_mul_ps(wd, p));
    __m512 m = _mm512_mul_ps(_mm512_loadu_ps(s.exp_avg + i), beta1);
    m = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta1, g));
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s.exp_avg_sq + i), beta2);
    v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bias2_sqrt), eps);
    p = _mm512_add_ps(p, _mm512_mul_ps(neg_step, _mm512_div_ps(m, denom)));
    _mm512_storeu_ps(s.param + i, p);
    _mm512_storeu_ps(s.exp_avg + i, m);
    _mm512_storeu_ps(s.exp_avg_sq + i, v);
    if (s.low_precision != nullptr) {
      auto* out = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(s.low_precision) + i);
      _mm256_storeu_si256(out, s.low_precision_dtype == DType::kFloat16
                                   ? _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT)
                                   : ToBf16x16(p));
    }
  }
  for (; i < end; ++i) AdamElement(s, k, i);
}

}  // namespace zerod::optim::internal
