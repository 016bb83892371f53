// The Prometheus text format 0.0.4: names, escaping, values, the writer's layout.

#include "server/metrics/text_format.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace zerod::metrics {
namespace {

TEST(TextFormat, MetricAndLabelNamesFollowThePrometheusGrammar) {
  EXPECT_TRUE(IsValidMetricName("zerod_jobs"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_TRUE(IsValidMetricName("_x9"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9lives"));
  EXPECT_FALSE(IsValidMetricName("zerod-jobs"));
  EXPECT_TRUE(IsValidLabelName("job"));
  EXPECT_FALSE(IsValidLabelName("__name__")) << "reserved";
  EXPECT_FALSE(IsValidLabelName("a:b")) << "no colon in label names";
  EXPECT_FALSE(IsValidLabelName("1a"));
}

TEST(TextFormat, HelpEscapesBackslashAndNewlineButNotQuotes) {
  EXPECT_EQ(EscapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");
}

TEST(TextFormat, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  EXPECT_EQ(EscapeLabelValue("plain-job_1.x"), "plain-job_1.x");
}

TEST(TextFormat, ValuesAreIntegersWhenExactAndShortestOtherwise) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(123456789012), "123456789012");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(TextFormat, TheWriterPutsHelpTypeAndSamplesOnTheirOwnLines) {
  TextWriter out;
  out.Header("zerod_jobs", "Jobs,\nby state.", "gauge");
  out.Sample("zerod_jobs", {{"state", "running"}}, 2);
  out.Sample("zerod_jobs", {{"state", "x\"y"}, {"b", "c"}}, 0.5);
  out.Sample("zerod_up", {}, 1);
  EXPECT_EQ(out.text(),
            "# HELP zerod_jobs Jobs,\\nby state.\n"
            "# TYPE zerod_jobs gauge\n"
            "zerod_jobs{state=\"running\"} 2\n"
            "zerod_jobs{state=\"x\\\"y\",b=\"c\"} 0.5\n"
            "zerod_up 1\n");
}

}  // namespace
}  // namespace zerod::metrics
