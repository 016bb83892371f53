// AVX-512 Adam: 32 floats per iteration (two vectors of 16); the same operations as AdamElement.
// Built with -mavx512f -mavx512bw, called only when the CPU has them. One loop per dtype
// combination (adam_dtypes.h), so the 16-bit paths carry no per-iteration dtype tests. Not
// VCVTNEPS2BF16 (AVX512_BF16) for the bf16 copy: it flushes subnormals, FloatToBf16 does not.

#include <immintrin.h>

#include "runtime/optim/internal/adam_dtypes.h"
#include "runtime/optim/internal/adam_element.h"

namespace zerod::optim::internal {
namespace {

struct Constants {
  explicit Constants(const AdamScalars& k)
      : multiplier(_mm512_set1_ps(k.grad_multiplier)),
        decay(_mm512_set1_ps(k.decay_factor)),
        wd(_mm512_set1_ps(k.weight_decay)),
        beta1(_mm512_set1_ps(k.beta1)),
        one_minus_beta1(_mm512_set1_ps(k.one_minus_beta1)),
        beta2(_mm512_set1_ps(k.beta2)),
        one_minus_beta2(_mm512_set1_ps(k.one_minus_beta2)),
        bias2_sqrt(_mm512_set1_ps(k.bias2_sqrt)),
        eps(_mm512_set1_ps(k.eps)),
        neg_step(_mm512_set1_ps(-k.step_size)) {}
  __m512 multiplier, decay, wd, beta1, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps,
      neg_step;
};

template <DType kGrad>
inline __m512 LoadGrad16(const void* grad, int64_t i) {
  if constexpr (kGrad == DType::kFloat32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (kGrad == DType::kFloat16) return _mm512_cvtph_ps(h);
    // bf16 is the top half of a float.
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// AdamElement on elements [i, i + 16): updates param, m and v in place, returns the new param.
template <DType kGrad>
inline __m512 Step16(const Constants& c, const void* grad, float* param, float* exp_avg,
                     float* exp_avg_sq, int64_t i) {
  __m512 g = _mm512_mul_ps(LoadGrad16<kGrad>(grad, i), c.multiplier);
  __m512 p = _mm512_mul_ps(_mm512_loadu_ps(param + i), c.decay);
  g = _mm512_add_ps(g, _mm512_mul_ps(c.wd, p));
  __m512 m = _mm512_mul_ps(_mm512_loadu_ps(exp_avg + i), c.beta1);
  m = _mm512_add_ps(m, _mm512_mul_ps(c.one_minus_beta1, g));
  __m512 v = _mm512_mul_ps(_mm512_loadu_ps(exp_avg_sq + i), c.beta2);
  v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bias2_sqrt), c.eps);
  p = _mm512_add_ps(p, _mm512_mul_ps(c.neg_step, _mm512_div_ps(m, denom)));
  _mm512_storeu_ps(param + i, p);
  _mm512_storeu_ps(exp_avg + i, m);
  _mm512_storeu_ps(exp_avg_sq + i, v);
  return p;
}

// FloatToBf16 on 16 floats, each result in the low half of its 32-bit lane (the high half zero):
// round to nearest even by adding 0x7fff plus the kept part's lowest bit, except that NaN keeps
// its top bits and becomes quiet. No overflow: the largest non-NaN pattern, -inf, has room.
inline __m512i Bf16Lanes(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, is_nan, high, _mm512_set1_epi32(0x40));
}

// Writes the copy of elements [i, i + 32) from their two vectors of new parameters.
template <Copy kCopy>
inline void StoreCopy32(void* low, int64_t i, __m512 p0, __m512 p1) {
  if constexpr (kCopy == Copy::kNone) return;  // `low` is null then: no pointer arithmetic on it
  auto* out = static_cast<uint16_t*>(low) + i;
  if constexpr (kCopy == Copy::kFp16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm512_cvtps_ph(p0, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16),
                        _mm512_cvtps_ph(p1, _MM_FROUND_TO_NEAREST_INT));
  } else if constexpr (kCopy == Copy::kBf16) {
    // Every lane is at most 0xffff, so the saturating pack is exact; it interleaves 64-bit groups
    // per 128-bit lane (p0 0-3, p1 0-3, p0 4-7, p1 4-7, ...), which the permute puts back in order.
    const __m512i packed = _mm512_packus_epi32(Bf16Lanes(p0), Bf16Lanes(p1));
    _mm512_storeu_si512(
        out, _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed));
  }
}

template <DType kGrad, Copy kCopy>
void Loop(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end) {
  const Constants c(k);
  float* const param = s.param;
  float* const exp_avg = s.exp_avg;
  float* const exp_avg_sq = s.exp_avg_sq;
  const void* const grad = s.grad;
  void* const low = s.low_precision;
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    // Four streams defeat some hardware prefetchers; ask for the lines 1 KiB ahead, one
    // prefetch per 64-byte line of each in-place stream.
    for (float* stream : {param, exp_avg, exp_avg_sq}) {
      _mm_prefetch(reinterpret_cast<const char*>(stream + i + 256), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(stream + i + 256 + 16), _MM_HINT_T0);
    }
    const __m512 p0 = Step16<kGrad>(c, grad, param, exp_avg, exp_avg_sq, i);
    const __m512 p1 = Step16<kGrad>(c, grad, param, exp_avg, exp_avg_sq, i + 16);
    StoreCopy32<kCopy>(low, i, p0, p1);
  }
  for (; i < end; ++i) AdamElement(s, k, i);
}

}  // namespace

void AdamAvx512(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end) {
  ForShardDtypes(s, [&](auto grad, auto copy) {
    Loop<decltype(grad)::value, decltype(copy)::value>(s, k, begin, end);
  });
}

}  // namespace zerod::optim::internal
