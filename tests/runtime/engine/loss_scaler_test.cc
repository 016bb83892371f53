// LossScaler: dynamic loss scaling as DeepSpeed applies it without consecutive hysteresis; every
// expectation below is a number the rules in loss_scaler.h produce by hand.

#include "runtime/engine/loss_scaler.h"

#include "gtest/gtest.h"

namespace zerod::engine {
namespace {

LossScaleOptions Enabled() {
  LossScaleOptions o;
  o.enabled = true;
  o.initial_scale = 1024;
  o.growth_interval = 3;
  o.hysteresis = 2;
  return o;
}

TEST(LossScaler, DisabledScalesByOneAndStillSkipsAnOverflow) {
  LossScaleOptions o = Enabled();
  o.enabled = false;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 1.0) << "the initial scale only applies when enabled";
  EXPECT_TRUE(s.Update(false));
  EXPECT_FALSE(s.Update(true)) << "a non-finite gradient is never applied";
  for (int i = 0; i < 10; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, DefaultsAreTheDocumentedOnes) {
  const LossScaleOptions o;
  EXPECT_FALSE(o.enabled);
  EXPECT_EQ(o.initial_scale, 65536.0);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.hysteresis, 2);
  EXPECT_EQ(o.min_scale, 1.0);
}

TEST(LossScaler, GrowsAfterEachGrowthIntervalOfCleanSteps) {
  LossScaler s(Enabled());
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.Update(false));
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 1024) << "two clean steps of three";
  EXPECT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 2048);
  // The count starts again after growing.
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048);
  s.Update(false);
  EXPECT_EQ(s.scale(), 4096);
}

TEST(LossScaler, AnOverflowSkipsTheStepAndRestartsTheCleanCount) {
  LossScaler s(Enabled());
  s.Update(false);
  s.Update(false);
  EXPECT_FALSE(s.Update(true)) << "a skipped step";
  EXPECT_EQ(s.scale(), 1024) << "hysteresis tolerates the first overflow";
  // Two clean steps before the overflow no longer count: growth needs three after it.
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 1024);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScaler, HysteresisDelaysTheBackoffThenEveryOverflowBacksOff) {
  LossScaler s(Enabled());
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 512);
  // Clean steps short of growth do not restore the hysteresis (not "consecutive" hysteresis).
  EXPECT_TRUE(s.Update(false));
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, GrowingRestoresTheHysteresis) {
  LossScaler s(Enabled());
  s.Update(true);
  s.Update(true);
  ASSERT_EQ(s.scale(), 512);
  for (int i = 0; i < 3; ++i) s.Update(false);
  ASSERT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 1024) << "one overflow tolerated again";
  s.Update(true);
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScaler, BacksOffNoLowerThanTheMinimum) {
  LossScaleOptions o = Enabled();
  o.initial_scale = 8;
  o.hysteresis = 1;
  o.min_scale = 3;
  LossScaler s(o);
  s.Update(true);
  EXPECT_EQ(s.scale(), 4);
  s.Update(true);
  EXPECT_EQ(s.scale(), 3) << "2 would be under min_scale";
  EXPECT_FALSE(s.Update(true)) << "at the minimum an overflow still skips the step";
  EXPECT_EQ(s.scale(), 3);
}

TEST(LossScaler, UsesTheGivenFactors) {
  LossScaleOptions o = Enabled();
  o.hysteresis = 1;
  o.growth_interval = 1;
  o.growth_factor = 4;
  o.backoff_factor = 0.25;
  LossScaler s(o);
  s.Update(false);
  EXPECT_EQ(s.scale(), 4096);
  s.Update(true);
  EXPECT_EQ(s.scale(), 1024);
}

TEST(LossScaler, HysteresisOfOneOrLessBacksOffAtOnce) {
  for (int64_t hysteresis : {0, 1}) {
    LossScaleOptions o = Enabled();
    o.hysteresis = hysteresis;
    LossScaler s(o);
    EXPECT_FALSE(s.Update(true));
    EXPECT_EQ(s.scale(), 512) << "hysteresis " << hysteresis;
  }
}

}  // namespace
}  // namespace zerod::engine
