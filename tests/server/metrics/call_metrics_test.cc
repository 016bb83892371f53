// The gRPC interceptor's method label: known methods by name, anything else "other".

#include "server/metrics/call_metrics.h"

#include "gtest/gtest.h"
#include "zerod/v1/coordinator.pb.h"
#include "zerod/v1/store.pb.h"

namespace zerod::metrics {
namespace {

TEST(CallMetrics, KnownMethodsKeepTheirNameOthersAreOther) {
  // The generated files are linked in (as in zerod, which serves them), so the pool knows them.
  ASSERT_NE(v1::HeartbeatRequest::descriptor(), nullptr);
  ASSERT_NE(v1::SetRequest::descriptor(), nullptr);
  EXPECT_EQ(MethodLabel("/zerod.v1.Coordinator/Heartbeat"), "/zerod.v1.Coordinator/Heartbeat");
  EXPECT_EQ(MethodLabel("/zerod.v1.Store/Set"), "/zerod.v1.Store/Set");
  EXPECT_EQ(MethodLabel("/grpc.health.v1.Health/Check"), "/grpc.health.v1.Health/Check");
  EXPECT_EQ(MethodLabel("/zerod.v1.Coordinator/NoSuchMethod"), "other");
  EXPECT_EQ(MethodLabel("/made.up.Service/X"), "other");
  EXPECT_EQ(MethodLabel("no-slash"), "other");
  EXPECT_EQ(MethodLabel("/"), "other");
  EXPECT_EQ(MethodLabel(""), "other");
}

}  // namespace
}  // namespace zerod::metrics
