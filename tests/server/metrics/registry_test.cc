// The metrics registry: families, series by label values, histograms, exposition, removal.

#include "server/metrics/registry.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zerod::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Registry, CountersAndGaugesAreWrittenByLabelValuesUnderOneHeader) {
  Registry r;
  CounterFamily& calls = r.AddCounter("t_calls_total", "Calls.", {"method", "code"});
  GaugeFamily& up = r.AddGauge("t_up", "Up.");
  calls.WithLabels({"/a", "OK"})->Increment();
  calls.WithLabels({"/a", "OK"})->Increment(2);
  calls.WithLabels({"/b", "NOT_FOUND"})->Increment();
  up.WithLabels({})->Set(1);
  up.WithLabels({})->Add(0.5);
  EXPECT_EQ(r.Scrape(),
            "# HELP t_calls_total Calls.\n"
            "# TYPE t_calls_total counter\n"
            "t_calls_total{method=\"/a\",code=\"OK\"} 3\n"
            "t_calls_total{method=\"/b\",code=\"NOT_FOUND\"} 1\n"
            "# HELP t_up Up.\n"
            "# TYPE t_up gauge\n"
            "t_up 1.5\n");
}

TEST(Registry, AHistogramWritesCumulativeBucketsSumAndCount) {
  Registry r;
  HistogramFamily& h = r.AddHistogram("t_seconds", "Latency.", {"op"}, {0.1, 1});
  Histogram& get = *h.WithLabels({"get"});
  get.Observe(0.05);
  get.Observe(0.1);  // "le": a value on a bound counts in that bucket
  get.Observe(0.5);
  get.Observe(absl::Seconds(3));
  EXPECT_EQ(r.Scrape(),
            "# HELP t_seconds Latency.\n"
            "# TYPE t_seconds histogram\n"
            "t_seconds_bucket{op=\"get\",le=\"0.1\"} 2\n"
            "t_seconds_bucket{op=\"get\",le=\"1\"} 3\n"
            "t_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"
            "t_seconds_sum{op=\"get\"} 3.65\n"
            "t_seconds_count{op=\"get\"} 4\n");
}

TEST(Registry, RemovedSeriesAreNoLongerWritten) {
  Registry r;
  CounterFamily& joins = r.AddCounter("t_joins_total", "Joins.", {"job"});
  joins.WithLabels({"a"})->Increment();
  joins.WithLabels({"b"})->Increment();
  joins.WithLabels({"c"})->Increment();
  joins.Remove({"a"});
  joins.RemoveIf([](const std::vector<std::string>& labels) { return labels[0] == "c"; });
  EXPECT_EQ(joins.size(), 1u);
  EXPECT_THAT(r.Scrape(), HasSubstr("t_joins_total{job=\"b\"} 1\n"));
  EXPECT_THAT(r.Scrape(), Not(HasSubstr("job=\"a\"")));
  EXPECT_THAT(r.Scrape(), Not(HasSubstr("job=\"c\"")));
  // A series created again starts from zero.
  joins.WithLabels({"a"})->Increment();
  EXPECT_THAT(r.Scrape(), HasSubstr("t_joins_total{job=\"a\"} 1\n"));
}

TEST(Registry, ASeriesRemovedWhileACallerUpdatesItLivesUntilTheCallerIsDone) {
  Registry r;
  CounterFamily& heartbeats = r.AddCounter("t_heartbeats_total", "H.", {"job_id"});
  std::shared_ptr<Counter> held = heartbeats.WithLabels({"ended"});
  heartbeats.Remove({"ended"});  // a scrape pruning an ended job
  held->Increment();             // the heartbeat that was already counting it
  EXPECT_EQ(held->value(), 1);
  EXPECT_THAT(r.Scrape(), Not(HasSubstr("ended")));
}

TEST(Registry, FamiliesAreWrittenInNameOrder) {
  Registry r;
  r.AddGauge("t_b", "B.").WithLabels({})->Set(2);
  r.AddGauge("t_a", "A.").WithLabels({})->Set(1);
  const std::string text = r.Scrape();
  EXPECT_LT(text.find("t_a 1"), text.find("t_b 2"));
}

TEST(Registry, ConcurrentUpdatesAreAllCounted) {
  Registry r;
  CounterFamily& c = r.AddCounter("t_total", "T.", {"worker"});
  HistogramFamily& h = r.AddHistogram("t_seconds", "T.");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, &h, t] {
      for (int i = 0; i < 10000; ++i) {
        c.WithLabels({std::to_string(t % 2)})->Increment();
        h.WithLabels({})->Observe(0.001);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.WithLabels({"0"})->value() + c.WithLabels({"1"})->value(), 40000);
  EXPECT_EQ(h.WithLabels({})->Read().count, 40000u);
}

TEST(RegistryDeathTest, ANameRegisteredTwiceIsAProgrammingError) {
  Registry r;
  r.AddCounter("t_total", "T.");
  EXPECT_DEATH(r.AddGauge("t_total", "Again."), "registered twice");
  EXPECT_DEATH(r.AddGauge("t-bad", "Bad."), "invalid metric name");
  EXPECT_DEATH(r.AddHistogram("t_h", "H.", {"le"}), "invalid label name");
  EXPECT_DEATH(r.AddCounter("t_c_total", "C.", {"job"}).WithLabels({}), "0 label values for 1");
}

}  // namespace
}  // namespace zerod::metrics
