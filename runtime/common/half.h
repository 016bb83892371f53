#ifndef ZEROD_RUNTIME_COMMON_HALF_H_
#define ZEROD_RUNTIME_COMMON_HALF_H_

// Scalar conversions between float and the 16-bit formats, both rounding to nearest even, as the
// hardware instructions (F16C, AVX-512 BF16) and PyTorch do. Vector kernels match these bit for
// bit.

#include <cstdint>
#include <cstring>

namespace zerod {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsFloat(sign);
  // Subnormal: normalise.
  int e = -1;
  do {
    ++e;
    mantissa <<= 1;
  } while ((mantissa & 0x400u) == 0);
  return BitsFloat(sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3ffu) << 13));
}

inline uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): shift the 24-bit significand into place, round to even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest
    const uint32_t exponent = abs >> 23;
    const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rest = significand & ((1u << shift) - 1);
    uint32_t result = significand >> shift;
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, to even.
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_HALF_H_
