// The vector 16-bit sums (AVX2 + F16C) against the scalar loop, bit for bit: every bf16 and fp16
// value as one operand, against rounding ties, infinities, NaNs, subnormals and random values as
// the other; lengths that leave a tail; the output aliasing an input.

#include "runtime/comm/gloo/element_sum.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/half.h"

namespace zerod::comm::internal {
namespace {

bool IsNan(DType dtype, uint16_t h) {
  return std::isnan(dtype == DType::kBFloat16 ? Bf16ToFloat(h) : Fp16ToFloat(h));
}

// Both ways over a and b; results equal bit for bit, except that of two NaNs added either may
// come out (the operand order the compiler picked decides, for the scalar loop too): then both
// must be NaN. Adds the sums compared bit for bit to *compared.
void ExpectSameSums(int64_t* compared, DType dtype, const std::vector<uint16_t>& a,
                    const std::vector<uint16_t>& b) {
  std::vector<uint16_t> vector(a.size()), scalar(a.size());
  ElementSum(dtype, vector.data(), a.data(), b.data(), a.size());
  ElementSum(dtype, scalar.data(), a.data(), b.data(), a.size(), SumIsa::kScalar);
  for (size_t i = 0; i < a.size(); ++i) {
    if (IsNan(dtype, a[i]) && IsNan(dtype, b[i])) {
      ASSERT_TRUE(IsNan(dtype, vector[i]) && IsNan(dtype, scalar[i]))
          << std::hex << a[i] << " + " << b[i];
      continue;
    }
    ASSERT_EQ(vector[i], scalar[i]) << std::hex << a[i] << " + " << b[i];
    ++*compared;
  }
}

class ElementSumTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!HaveAvx2Sums()) GTEST_SKIP() << "this CPU has no AVX2 + F16C: only the scalar loop runs";
  }
};

TEST_P(ElementSumTest, EveryValuePlusSpecialAndRandomValuesMatchesTheScalarLoop) {
  const DType dtype = GetParam();
  const bool bf16 = dtype == DType::kBFloat16;
  // Infinities, NaNs (quiet and signalling, both signs), zeros, the largest and smallest normal
  // and subnormal values, one ulp, and values whose sums round to even or overflow.
  std::vector<uint16_t> others =
      bf16 ? std::vector<uint16_t>{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1, 0x7f7f,
                                   0xff7f, 0x0080, 0x0001, 0x807f, 0x3f80, 0x3f81, 0xbf80, 0x4000}
           : std::vector<uint16_t>{0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x7bff,
                                   0xfbff, 0x0400, 0x0001, 0x83ff, 0x3c00, 0x3c01, 0xbc00, 0x4000};
  std::mt19937 random(15);
  for (int k = 0; k < 48; ++k) others.push_back(static_cast<uint16_t>(random()));
  std::vector<uint16_t> every(65536);
  for (uint32_t h = 0; h < 65536; ++h) every[h] = static_cast<uint16_t>(h);
  int64_t compared = 0;
  for (uint16_t other : others) {
    ExpectSameSums(&compared, dtype, every, std::vector<uint16_t>(every.size(), other));
    if (HasFatalFailure()) return;
  }
  // Random pairs, and lengths around the 16-element step.
  std::vector<uint16_t> a(1 << 20), b(1 << 20);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint16_t>(random());
    b[i] = static_cast<uint16_t>(random());
  }
  ExpectSameSums(&compared, dtype, a, b);
  for (size_t n : {0, 1, 15, 16, 17, 31, 33}) {
    ExpectSameSums(&compared, dtype, std::vector<uint16_t>(a.begin(), a.begin() + n),
                   std::vector<uint16_t>(b.begin(), b.begin() + n));
  }
  // Most sums are numbers (NaN operands make NaN whichever way): the check is not all NaN.
  EXPECT_GT(compared, 64 * 65536 / 2);
}

TEST_P(ElementSumTest, TheOutputMayBeAnInput) {
  const DType dtype = GetParam();
  std::vector<uint16_t> a(1000), b(1000);
  for (size_t i = 0; i < a.size(); ++i) {
    const float x = static_cast<float>(i) * 0.37f - 100.0f, y = std::sin(static_cast<float>(i));
    a[i] = dtype == DType::kBFloat16 ? FloatToBf16(x) : FloatToFp16(x);
    b[i] = dtype == DType::kBFloat16 ? FloatToBf16(y) : FloatToFp16(y);
  }
  std::vector<uint16_t> want(a.size());
  ElementSum(dtype, want.data(), a.data(), b.data(), a.size(), SumIsa::kScalar);
  std::vector<uint16_t> into_a = a, into_b = b;
  ElementSum(dtype, into_a.data(), into_a.data(), b.data(), a.size());
  ElementSum(dtype, into_b.data(), a.data(), into_b.data(), a.size());
  EXPECT_EQ(into_a, want);
  EXPECT_EQ(into_b, want);
}

INSTANTIATE_TEST_SUITE_P(SixteenBit, ElementSumTest,
                         ::testing::Values(DType::kBFloat16, DType::kFloat16),
                         [](const auto& info) {
                           return std::string(info.param == DType::kBFloat16 ? "Bf16" : "Fp16");
                         });

}  // namespace
}  // namespace zerod::comm::internal
