// JobHistory: the points between two samples, what resets them, the bound, and sampling a real
// registry.

#include "server/status/job_history.h"

#include <future>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/status/history_sampler.h"
#include "tests/server/status/running_job.h"

namespace zerod::status {
namespace {

JobSample Sample(double seconds, int64_t step, int64_t comm_bytes, int64_t generation = 1,
                 int64_t active = 2) {
  JobSample s;
  s.time = absl::FromUnixSeconds(1000) + absl::Seconds(seconds);
  s.generation = generation;
  s.active_members = active;
  s.step = step;
  s.comm_bytes = comm_bytes;
  return s;
}

TEST(PointBetween, GivesTheStepRateAndTheBytesOneRankSentPerStep) {
  const std::optional<HistoryPoint> p = PointBetween(Sample(0, 10, 1000), Sample(2, 14, 9000));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->step, 14);
  EXPECT_DOUBLE_EQ(p->steps_per_second, 2.0);
  // 8000 bytes by two ranks over four steps.
  ASSERT_TRUE(p->bytes_per_step.has_value());
  EXPECT_DOUBLE_EQ(*p->bytes_per_step, 1000.0);
  EXPECT_EQ(p->unix_ms, 1002000);
}

TEST(PointBetween, AStalledJobIsAPointAtZeroWithNoBytesPerStep) {
  const std::optional<HistoryPoint> p = PointBetween(Sample(0, 10, 1000), Sample(1, 10, 1000));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->steps_per_second, 0.0);
  EXPECT_FALSE(p->bytes_per_step.has_value());
}

TEST(PointBetween, SamplesThatCannotBeComparedGiveNoPoint) {
  const JobSample before = Sample(0, 10, 1000);
  EXPECT_FALSE(PointBetween(before, Sample(1, 12, 2000, /*generation=*/2)));
  EXPECT_FALSE(PointBetween(before, Sample(1, 12, 2000, 1, /*active=*/1)));
  EXPECT_FALSE(PointBetween(before, Sample(1, 3, 2000))) << "a restarted rank counts from 0";
  EXPECT_FALSE(PointBetween(before, Sample(1, 12, 500)));
  EXPECT_FALSE(PointBetween(before, Sample(0, 12, 2000))) << "no time between them";
}

TEST(JobHistory, KeepsOnlyTheNewestPoints) {
  JobHistory history(/*max_samples=*/3);
  for (int i = 0; i <= 10; ++i) history.Add("j", Sample(i, i * 2, i * 100));
  const std::vector<HistoryPoint> points = history.Of("j");
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points.front().step, 16);
  EXPECT_EQ(points.back().step, 20);
  EXPECT_EQ(history.Last("j")->step, 20);
  EXPECT_TRUE(history.Of("other").empty());
  EXPECT_FALSE(history.Last("other").has_value());
}

TEST(JobHistory, SamplesTheRegistryAndForgetsJobsItNoLongerHolds) {
  RunningJob env;
  ASSERT_NO_FATAL_FAILURE(env.Form("llama", 2));
  JobHistory history;
  // A job the registry does not hold (gone since it was sampled) is forgotten at the next sample.
  history.Add("ghost", Sample(0, 1, 0));
  history.Add("ghost", Sample(1, 2, 0));
  ASSERT_EQ(history.Of("ghost").size(), 1u);
  env.Heartbeat("llama", 0, 5, 1000);
  env.Heartbeat("llama", 1, 4, 1000);
  history.Sample(env.registry(), absl::FromUnixSeconds(100));
  EXPECT_TRUE(history.Of("llama").empty()) << "one sample is no rate yet";
  EXPECT_TRUE(history.Of("ghost").empty());
  env.Heartbeat("llama", 0, 9, 5000);
  env.Heartbeat("llama", 1, 8, 5000);
  history.Sample(env.registry(), absl::FromUnixSeconds(102));
  const std::vector<HistoryPoint> points = history.Of("llama");
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].step, 8) << "the slowest rank's step";
  EXPECT_DOUBLE_EQ(points[0].steps_per_second, 2.0);
  EXPECT_DOUBLE_EQ(*points[0].bytes_per_step, 1000.0);

  // An ended job keeps its points (the registry still holds it) and takes no more.
  std::promise<absl::Status> ended;
  env.registry().EndJob("llama", [&ended](absl::Status s) { ended.set_value(s); });
  ASSERT_TRUE(ended.get_future().get().ok());
  history.Sample(env.registry(), absl::FromUnixSeconds(104));
  EXPECT_EQ(history.Of("llama").size(), 1u);
}

// The sampler's own thread fills the history while the job steps, and Stop joins it.
TEST(HistorySampler, SamplesOnItsOwnUntilStopped) {
  RunningJob env;
  ASSERT_NO_FATAL_FAILURE(env.Form("llama", 1));
  HistorySampler sampler(&env.registry(), absl::Milliseconds(10));
  int64_t step = 0;
  // Generous: a loaded machine may starve the sampler's thread for a while.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (sampler.history().Of("llama").empty() && absl::Now() < deadline) {
    ++step;
    env.Heartbeat("llama", 0, step, step * 100);
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_FALSE(sampler.history().Of("llama").empty());
  sampler.Stop();
  const size_t points = sampler.history().Of("llama").size();
  ++step;
  env.Heartbeat("llama", 0, step, step * 100);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(sampler.history().Of("llama").size(), points) << "sampled after Stop";
}

}  // namespace
}  // namespace zerod::status
