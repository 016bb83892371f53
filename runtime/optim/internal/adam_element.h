#ifndef ZEROD_RUNTIME_OPTIM_INTERNAL_ADAM_ELEMENT_H_
#define ZEROD_RUNTIME_OPTIM_INTERNAL_ADAM_ELEMENT_H_

// One element of the Adam step: the reference for every vector kernel, which perform the same
// float operations in the same order (no fused multiply-add), so all ISAs agree bit for bit.

#include <cmath>

#include "runtime/common/half.h"
#include "runtime/optim/adam.h"

namespace zerod::optim::internal {

inline float LoadGrad(const AdamShard& s, int64_t i) {
  switch (s.grad_dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(s.grad)[i];
    case DType::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(s.grad)[i]);
    case DType::kFloat16:
      return Fp16ToFloat(static_cast<const uint16_t*>(s.grad)[i]);
  }
  return 0;
}

inline void AdamElement(const AdamShard& s, const AdamScalars& k, int64_t i) {
  float g = LoadGrad(s, i) * k.grad_multiplier;
  float p = s.param[i];
  p = p * k.decay_factor;               // AdamW: param.mul_(1 - lr * wd)
  g = g + k.weight_decay * p;           // Adam: grad.add(param, alpha=wd)
  float m = s.exp_avg[i] * k.beta1;     // exp_avg.mul_(beta1)
  m = m + k.one_minus_beta1 * g;        //   .add_(grad, alpha=1 - beta1)
  float v = s.exp_avg_sq[i] * k.beta2;  // exp_avg_sq.mul_(beta2)
  v = v + (k.one_minus_beta2 * g) * g;  //   .addcmul_(grad, grad, value=1 - beta2)
  const float denom = std::sqrt(v) / k.bias2_sqrt + k.eps;
  p = p + (-k.step_size) * (m / denom);  // param.addcdiv_(m, denom, value=-step_size)
  s.param[i] = p;
  s.exp_avg[i] = m;
  s.exp_avg_sq[i] = v;
  if (s.low_precision != nullptr) {
    static_cast<uint16_t*>(s.low_precision)[i] =
        s.low_precision_dtype == DType::kFloat16 ? FloatToFp16(p) : FloatToBf16(p);
  }
}

}  // namespace zerod::optim::internal

#endif  // ZEROD_RUNTIME_OPTIM_INTERNAL_ADAM_ELEMENT_H_
