#include "runtime/common/half.h"

#include <immintrin.h>

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "runtime/common/cpu_features.h"

namespace zerod {
namespace {

__attribute__((target("f16c"))) float HardwareFp16ToFloat(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t HardwareFloatToFp16(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

TEST(Half, Fp16MatchesTheHardwareEverywhere) {
  if (!CpuHasF16c()) GTEST_SKIP() << "skipped: this CPU has no F16C to compare against";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = Fp16ToFloat(static_cast<uint16_t>(h));
    const float hw = HardwareFp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(ours)) << h;
    } else {
      ASSERT_EQ(FloatBits(ours), FloatBits(hw)) << h;
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = BitsFloat(i < 1'000'000 ? static_cast<uint32_t>(i) * 4297u : rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToFp16(f), HardwareFloatToFp16(f)) << FloatBits(f);
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_EQ(Bf16ToFloat(0x4049), BitsFloat(0x40490000u));
}

}  // namespace
}  // namespace zerod
