// StepRate: steps per second over a window, whatever the scrape interval.

#include "server/metrics/step_rate.h"

#include "gtest/gtest.h"

namespace zerod::metrics {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(StepRate, NeedsTwoSamplesAtDistinctTimes) {
  StepRate rate;
  EXPECT_FALSE(rate.Update("a", 10, kStart).has_value());
  EXPECT_FALSE(rate.Update("a", 10, kStart).has_value());
  EXPECT_DOUBLE_EQ(*rate.Update("a", 30, kStart + absl::Seconds(10)), 2.0);
}

TEST(StepRate, FrequentScrapesGiveTheRateOverTheWindow) {
  StepRate rate(absl::Seconds(30));
  // 1 step/s for a minute, then 5 steps/s: a scrape each second.
  int64_t step = 0;
  for (int s = 0; s <= 60; ++s) rate.Update("a", step++, kStart + absl::Seconds(s));
  std::optional<double> last;
  for (int s = 61; s <= 100; ++s) {
    step += 5;
    last = rate.Update("a", step, kStart + absl::Seconds(s));
  }
  EXPECT_NEAR(*last, 5.0, 1e-9) << "the window holds only the fast steps";
}

TEST(StepRate, ScrapesFurtherApartThanTheWindowUseThePreviousOne) {
  StepRate rate(absl::Seconds(30));
  rate.Update("a", 0, kStart);
  EXPECT_DOUBLE_EQ(*rate.Update("a", 120, kStart + absl::Minutes(2)), 1.0);
  EXPECT_DOUBLE_EQ(*rate.Update("a", 480, kStart + absl::Minutes(4)), 3.0);
}

TEST(StepRate, AStepGoingBackStartsOverAndJobsAreApart) {
  StepRate rate;
  rate.Update("a", 100, kStart);
  rate.Update("b", 0, kStart);
  EXPECT_FALSE(rate.Update("a", 50, kStart + absl::Seconds(1)).has_value())
      << "resumed from an earlier checkpoint";
  EXPECT_DOUBLE_EQ(*rate.Update("a", 60, kStart + absl::Seconds(2)), 10.0);
  EXPECT_DOUBLE_EQ(*rate.Update("b", 4, kStart + absl::Seconds(2)), 2.0);
  rate.Retain({"b"});
  EXPECT_FALSE(rate.Update("a", 70, kStart + absl::Seconds(3)).has_value()) << "forgotten";
}

}  // namespace
}  // namespace zerod::metrics
