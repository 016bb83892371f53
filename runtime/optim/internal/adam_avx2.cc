// AVX2 Adam: 16 floats per iteration (two vectors of 8); the same operations as AdamElement. Built
// with -mavx2 -mf16c (no FMA contraction), called only when the CPU has them. One loop per dtype
// combination (adam_dtypes.h), so the 16-bit paths carry no per-iteration dtype tests.

#include <immintrin.h>

#include "runtime/common/half_avx2.h"
#include "runtime/optim/internal/adam_dtypes.h"
#include "runtime/optim/internal/adam_element.h"

namespace zerod::optim::internal {
namespace {

struct Constants {
  explicit Constants(const AdamScalars& k)
      : multiplier(_mm256_set1_ps(k.grad_multiplier)),
        decay(_mm256_set1_ps(k.decay_factor)),
        wd(_mm256_set1_ps(k.weight_decay)),
        beta1(_mm256_set1_ps(k.beta1)),
        one_minus_beta1(_mm256_set1_ps(k.one_minus_beta1)),
        beta2(_mm256_set1_ps(k.beta2)),
        one_minus_beta2(_mm256_set1_ps(k.one_minus_beta2)),
        bias2_sqrt(_mm256_set1_ps(k.bias2_sqrt)),
        eps(_mm256_set1_ps(k.eps)),
        neg_step(_mm256_set1_ps(-k.step_size)) {}
  __m256 multiplier, decay, wd, beta1, one_minus_beta1, beta2, one_minus_beta2, bias2_sqrt, eps,
      neg_step;
};

// The gradients of elements [i, i + 16), as two vectors of 8 floats.
template <DType kGrad>
inline void LoadGrad16(const void* grad, int64_t i, __m256* g0, __m256* g1) {
  if constexpr (kGrad == DType::kFloat32) {
    *g0 = _mm256_loadu_ps(static_cast<const float*>(grad) + i);
    *g1 = _mm256_loadu_ps(static_cast<const float*>(grad) + i + 8);
  } else if constexpr (kGrad == DType::kFloat16) {
    *g0 = avx2::LoadFp16x8(static_cast<const uint16_t*>(grad) + i);
    *g1 = avx2::LoadFp16x8(static_cast<const uint16_t*>(grad) + i + 8);
  } else {
    avx2::LoadBf16x16(static_cast<const uint16_t*>(grad) + i, g0, g1);
  }
}

// AdamElement on elements [i, i + 8) with their gradients `grad`: updates param, m and v in
// place, returns the new param.
inline __m256 Step8(const Constants& c, __m256 grad, float* param, float* exp_avg,
                    float* exp_avg_sq, int64_t i) {
  __m256 g = _mm256_mul_ps(grad, c.multiplier);
  __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param + i), c.decay);
  g = _mm256_add_ps(g, _mm256_mul_ps(c.wd, p));
  __m256 m = _mm256_mul_ps(_mm256_loadu_ps(exp_avg + i), c.beta1);
  m = _mm256_add_ps(m, _mm256_mul_ps(c.one_minus_beta1, g));
  __m256 v = _mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + i), c.beta2);
  v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.bias2_sqrt), c.eps);
  p = _mm256_add_ps(p, _mm256_mul_ps(c.neg_step, _mm256_div_ps(m, denom)));
  _mm256_storeu_ps(param + i, p);
  _mm256_storeu_ps(exp_avg + i, m);
  _mm256_storeu_ps(exp_avg_sq + i, v);
  return p;
}

// Writes the copy of elements [i, i + 16) from their two vectors of new parameters.
template <Copy kCopy>
inline void StoreCopy16(void* low, int64_t i, __m256 p0, __m256 p1) {
  if constexpr (kCopy == Copy::kNone) return;  // `low` is null then: no pointer arithmetic on it
  auto* out = static_cast<uint16_t*>(low) + i;
  if constexpr (kCopy == Copy::kFp16) {
    avx2::StoreFp16x8(out, p0);
    avx2::StoreFp16x8(out + 8, p1);
  } else if constexpr (kCopy == Copy::kBf16) {
    avx2::StoreBf16x16(out, p0, p1);
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
  for (; i + 16 <= end; i += 16) {
    // Four streams defeat some hardware prefetchers; ask for the lines 1 KiB ahead, one
    // prefetch per 64-byte line of each in-place stream.
    _mm_prefetch(reinterpret_cast<const char*>(param + i + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(exp_avg + i + 256), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(exp_avg_sq + i + 256), _MM_HINT_T0);
    __m256 g0, g1;
    LoadGrad16<kGrad>(grad, i, &g0, &g1);
    const __m256 p0 = Step8(c, g0, param, exp_avg, exp_avg_sq, i);
    const __m256 p1 = Step8(c, g1, param, exp_avg, exp_avg_sq, i + 8);
    StoreCopy16<kCopy>(low, i, p0, p1);
  }
  for (; i < end; ++i) AdamElement(s, k, i);
}

}  // namespace

void AdamAvx2(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end) {
  ForShardDtypes(s, [&](auto grad, auto copy) {
    Loop<decltype(grad)::value, decltype(copy)::value>(s, k, begin, end);
  });
}

}  // namespace zerod::optim::internal
