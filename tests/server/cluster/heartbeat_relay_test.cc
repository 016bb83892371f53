// HeartbeatRelay against a real zerod as the leader: a node's ranks' heartbeats answered on the
// node and sent to the leader together, the leader's answers and refusals passed on, a leader gone
// named (server/cluster/heartbeat_relay.h).

#include "server/cluster/heartbeat_relay.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/server/cluster/leader_process.h"
#include "tests/util/test_time.h"

namespace zerod::server::cluster {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kInterval = absl::Milliseconds(100);

// Joins a job of `world` ranks on the leader (one client per rank, all waiting together).
void FormJob(const LeaderProcess& leader, const std::string& job, int world) {
  std::vector<std::thread> ranks;
  std::atomic<int> formed{0};
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      client::ClientOptions options;
      options.endpoint = "unix://" + leader.socket();
      auto client = client::CoordinatorClient::Connect(options);
      if (!client.ok()) return;
      client::JoinOptions join;
      join.job_id = job;
      join.world_size = world;
      join.rank = r;
      join.host = "node-a";
      join.device = "cpu";
      join.layout = plan::SyntheticLayout(1000, DType::kFloat32, 4);
      if ((*client)->Join(join, zerod::testing::Scaled(absl::Seconds(30))).ok()) formed++;
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_EQ(formed.load(), world) << leader.Log();
}

// One rank's heartbeat through the relay, waited for.
struct Answered {
  grpc::Status status;
  v1::HeartbeatResponse response;
};
Answered Beat(HeartbeatRelay& relay, const std::string& job, int64_t rank) {
  v1::HeartbeatRequest request;
  request.set_job_id(job);
  request.set_rank(rank);
  request.set_generation(1);
  Notification done;
  Answered answered;
  relay.Take(request, "", [&](const grpc::Status& s, const v1::HeartbeatResponse& r) {
    answered = {s, r};
    done.Notify();
  });
  done.WaitForNotification();
  return answered;
}

std::unique_ptr<HeartbeatRelay> RelayTo(const LeaderProcess& leader) {
  return std::make_unique<HeartbeatRelay>(
      grpc::CreateChannel(leader.tcp_endpoint(), grpc::InsecureChannelCredentials()), "node-0",
      "node-1", kInterval);
}

TEST(HeartbeatRelay, ManyRanksHeartbeatsReachTheLeaderInOneCallPerInterval) {
  LeaderProcess leader;
  ASSERT_NO_FATAL_FAILURE(FormJob(leader, "relayed", 4));
  auto relay = RelayTo(leader);
  // Every rank's first heartbeat waits for a flush; the answers are the leader's.
  for (int r = 0; r < 4; ++r) {
    const Answered a = Beat(*relay, "relayed", r);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.response.generation(), 1);
    EXPECT_EQ(a.response.job_state(), v1::JOB_RUNNING);
  }
  // Then 4 ranks heartbeating every 10 ms, 100 times each (a second or more; a count, not a time,
  // so that a slow build sends as many): 400 heartbeats, answered on the node.
  const int64_t calls_before = relay->calls();
  const absl::Time start = absl::Now();
  int answered = 0;
  for (int round = 0; round < 100; ++round) {
    for (int r = 0; r < 4; ++r) {
      const Answered a = Beat(*relay, "relayed", r);
      answered += a.status.ok() ? 1 : 0;
      if (!a.status.ok()) ADD_FAILURE() << a.status.error_message();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  const double intervals = absl::FDivDuration(absl::Now() - start, kInterval);
  const int64_t calls = relay->calls() - calls_before;
  EXPECT_EQ(answered, 400);
  // One call per interval at most (and a flush at either end), whatever the number of ranks.
  EXPECT_LE(calls, static_cast<int64_t>(intervals) + 2) << answered << " heartbeats";
  EXPECT_GE(calls, 2);
}

TEST(HeartbeatRelay, TheLeadersRefusalOfARankIsPassedOnAndALeaderGoneIsNamed) {
  LeaderProcess leader;
  ASSERT_NO_FATAL_FAILURE(FormJob(leader, "refused", 2));
  auto relay = RelayTo(leader);
  const Answered unknown = Beat(*relay, "no-such-job", 0);
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.status.error_message(), HasSubstr("no-such-job"));
  ASSERT_TRUE(Beat(*relay, "refused", 0).status.ok());
  leader.Crash();
  // A cached answer is served for two intervals at most; then the leader's absence is named.
  const absl::Time crashed = absl::Now();
  Answered after;
  do {
    after = Beat(*relay, "refused", 0);
  } while (after.status.ok() && absl::Now() - crashed < zerod::testing::Scaled(absl::Seconds(10)));
  EXPECT_EQ(after.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(after.status.error_message(), HasSubstr("zerod leader node-0"));
  EXPECT_LT(absl::Now() - crashed, zerod::testing::Scaled(absl::Seconds(10)));
}

TEST(HeartbeatRelay, OnlyTheClustersMembersMayRelayHeartbeats) {
  // With authentication on, a NodeHeartbeat from a caller without a member's certificate is
  // refused whole.
  LeaderProcess leader(std::vector<std::string>{});
  auto relay = RelayTo(leader);
  const Answered refused = Beat(*relay, "any", 0);
  // Passed on as refused, not as "unavailable": retrying cannot help.
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("only the members of this zerod's cluster"));
}

}  // namespace
}  // namespace zerod::server::cluster
