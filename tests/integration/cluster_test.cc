// A zerod on every node: three real zerods (each its own socket, data dir and node name) on a real
// 3-member etcd (--store etcd://...), one leading and two forwarding to it; train_mlp ranks, two
// per daemon, each talking only to its own node's daemon. A killed follower, a killed leader, a
// killed etcd leader (docs/ARCHITECTURE.md, "A zerod on every node"). With security on, as
// docs/operators.md sets it up: etcd speaks TLS on its client and peer ports with certificates
// required and authentication on; the zerods speak TLS to it as its user zerod, and mutual TLS to
// one another (cluster_security_test.cc tries to get past it).

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zerod_cluster.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/etcd_cluster.h"
#include "zerod/v1/coordinator.grpc.pb.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kNodes = ZerodCluster::kNodes;
constexpr int kRanksPerNode = 2;
constexpr int kWorld = kNodes * kRanksPerNode;

std::string NodeHost(int node) { return ZerodCluster::NodeHost(node); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// kWorld train_mlp ranks of `job`, rank r on node r / kRanksPerNode, with `args`. No
// ZEROD_GLOO_HOST: each rank listens for its peers where its node's zerod says (NodeHost).
std::vector<std::unique_ptr<ChildProcess>> StartRanks(ZerodCluster& cluster, const std::string& job,
                                                      const std::vector<std::string>& args,
                                                      const TempDir& logs) {
  // Saved where the ranks (and this test's clients) find it, as zerorun's ranks get one.
  EXPECT_TRUE(client::JobTokenOrNew(job).ok());
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> argv = {Built(TRAIN_MLP_PATH)};
    argv.insert(argv.end(), args.begin(), args.end());
    ranks.push_back(std::make_unique<ChildProcess>(
        argv, absl::StrCat(logs.path(), "/", job, "-rank", r, ".log"),
        std::vector<std::string>{"ZEROD_ENDPOINT=" + cluster.daemon(r / kRanksPerNode).endpoint(),
                                 "ZEROD_JOB=" + job, absl::StrCat("ZEROD_RANK=", r),
                                 absl::StrCat("ZEROD_WORLD_SIZE=", kWorld),
                                 // Longer than a leader's replacement takes on a loaded machine
                                 // (its claim lapses, a follower recovers the state): the ranks
                                 // of surviving nodes retry through it, as they would with the
                                 // SDK's default (60s).
                                 "ZEROD_RETRY_FOR=" + ScaledFlag(absl::Seconds(30))}));
  }
  return ranks;
}

void WaitForStep(ChildProcess& rank, int step) {
  const std::string marker = absl::StrCat("step ", step, " ");
  EXPECT_TRUE(Eventually([&] { return rank.Output().find(marker) != std::string::npos; },
                         absl::Seconds(120)))
      << rank.Output();
}

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdCluster::Installed(/*with_etcdctl=*/true)) {
      GTEST_SKIP() << "needs /usr/bin/etcd and /usr/bin/etcdctl (scripts/setup.sh)";
    }
    etcd_ = std::make_unique<EtcdCluster>(
        3, EtcdSecurity{.tls = true, .auth = true, .zerod_prefix = "/zerod-test/"});
    ASSERT_EQ(etcd_->error(), "");
  }
  std::unique_ptr<EtcdCluster> etcd_;
  TempDir logs_;
};

TEST_F(Cluster, SixRanksOnThreeDaemonsTrainToTheUnshardedLossAndEveryDaemonShowsTheWholeJob) {
  ZerodCluster cluster(*etcd_, absl::Seconds(10), logs_);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  const ProcessResult reference =
      RunProcess({Built(TRAIN_MLP_PATH), "--reference", "--world", std::to_string(kWorld),
                  "--steps", "4", "--seed", "3"});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const double want = TrainSummary(reference.out)["final_loss"].get<double>();
  for (const std::string stage : {"2", "3"}) {
    const std::string job = "spread-" + stage;
    auto ranks = StartRanks(cluster, job, {"--stage", stage, "--steps", "4", "--seed", "3"}, logs_);
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(ranks[r]->Wait(absl::Seconds(180)), 0)
          << "rank " << r << ": " << ranks[r]->Output();
      EXPECT_THAT(ranks[r]->Output(), HasSubstr("step 4 loss"));
      // Its node's zerod told it where its peers reach it (through a follower's socket, too).
      EXPECT_THAT(ranks[r]->Output(),
                  HasSubstr(absl::StrCat("rank ", r, " of ", kWorld, ": peers reach it at ",
                                         NodeHost(r / kRanksPerNode), "\n")));
    }
    // Rank 0 prints the run's summary.
    const double got = TrainSummary(ranks[0]->Output())["final_loss"].get<double>();
    EXPECT_NEAR(got, want, 1e-5 * want) << "stage " << stage;
  }
  // Every daemon answers for the whole job: the same members, on every node.
  for (int node = 0; node < kNodes; ++node) {
    const ProcessResult members = cluster.daemon(node).Zeroctl({"members", "spread-3", "--json"});
    ASSERT_EQ(members.exit_code, 0) << members.err;
    const json view = json::parse(members.out);
    EXPECT_EQ(view["members"].size(), static_cast<size_t>(kWorld)) << members.out;
    EXPECT_EQ(cluster.daemon(node).Zeroctl({"jobs"}).out, cluster.daemon(0).Zeroctl({"jobs"}).out);
  }
  // The followers relayed their ranks' calls; only the leader ran the registry.
  EXPECT_THAT(cluster.Log(1), Not(HasSubstr("job(s) recovered")));
}

// The killed node's ranks are lost one lease after its death. 4s (scaled), not less: under
// ThreadSanitizer on a loaded machine a live rank's heartbeats can be seconds apart while the
// session starts.
constexpr absl::Duration kShortLease = absl::Seconds(4);

TEST_F(Cluster, AKilledFollowersRanksAreDeclaredLostAndTheOthersAreToldWhich) {
  ZerodCluster cluster(*etcd_, kShortLease, logs_);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto ranks = StartRanks(cluster, "follower-dies", {"--stage", "2", "--steps", "1000000"}, logs_);
  WaitForStep(*ranks[0], 3);
  cluster.daemon(2).Crash();  // node 2: ranks 4 and 5 lose their daemon
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r]->Wait(absl::Seconds(60)), 1) << ranks[r]->Output();
    // Both, or the first whose lease ran out (a loaded machine sweeps them apart).
    EXPECT_THAT(ranks[r]->Output(), ContainsRegex("rank (4, 5 were|4 was|5 was) lost"))
        << ranks[r]->Output();
  }
  for (int r = 4; r < kWorld; ++r) ranks[r]->Signal(SIGKILL);
  EXPECT_THAT(cluster.daemon(1).Zeroctl({"members", "follower-dies"}).out, HasSubstr("lost"));
}

TEST_F(Cluster, AKilledLeaderIsReplacedByAFollowerThatKeepsTheJobAndDeclaresItsRanksLost) {
  // The surviving ranks must reach the new leader (itself, or the other follower once it follows
  // again) within the lease and the grace the recovery gives them: a grace of a second can lose a
  // survivor under the sanitizers on a loaded machine.
  ZerodCluster cluster(*etcd_, kShortLease, logs_, /*restart_grace=*/absl::Seconds(3));
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto ranks = StartRanks(cluster, "leader-dies", {"--stage", "2", "--steps", "1000000"}, logs_);
  WaitForStep(*ranks[5], 3);
  cluster.daemon(0).Crash();  // node 0 led: ranks 0 and 1 lose their daemon
  ASSERT_TRUE(Eventually([&] { return cluster.Leads(1) || cluster.Leads(2); }, absl::Seconds(60)))
      << cluster.Log(1) << cluster.Log(2);
  const int leader = cluster.Leads(1) ? 1 : 2;
  EXPECT_THAT(cluster.Log(leader), HasSubstr("1 job(s) recovered"));
  for (int r = 2; r < kWorld; ++r) {
    EXPECT_EQ(ranks[r]->Wait(absl::Seconds(90)), 1) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), ContainsRegex("rank (0, 1 were|0 was|1 was) lost"))
        << ranks[r]->Output();
  }
  for (int r = 0; r < 2; ++r) ranks[r]->Signal(SIGKILL);
  // The other follower now forwards to the new leader: the job is seen from it too.
  const int other = leader == 1 ? 2 : 1;
  EXPECT_TRUE(Eventually(
      [&] {
        return cluster.daemon(other).Zeroctl({"members", "leader-dies"}).out.find("lost") !=
               std::string::npos;
      },
      absl::Seconds(30)))
      << cluster.Log(other);
}

TEST_F(Cluster, KillingTheEtcdLeaderMidJobLosesNothingAndTrainingGoesOn) {
  // A longer lease: etcd's new election must not be mistaken for lost ranks or a lost claim.
  ZerodCluster cluster(*etcd_, absl::Seconds(6), logs_);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto ranks = StartRanks(cluster, "etcd-dies", {"--stage", "3", "--steps", "1000000"}, logs_);
  WaitForStep(*ranks[0], 3);
  auto client = cluster.daemon(1).Client();
  ASSERT_TRUE(client->StoreSet("etcd-dies", "before", "kept").ok());
  const int etcd_leader = etcd_->Leader();
  ASSERT_GE(etcd_leader, 0);
  etcd_->Kill(etcd_leader);
  // Training goes on: every rank gets well past where it was.
  std::vector<size_t> seen;
  for (auto& rank : ranks) seen.push_back(rank->Output().size());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(
        Eventually([&] { return ranks[r]->Output().size() > seen[r] + 400; }, absl::Seconds(120)))
        << ranks[r]->Output();
  }
  // Nothing committed was lost, and writes go on.
  auto kept = client->StoreGet("etcd-dies", "before", absl::ZeroDuration());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "kept");
  EXPECT_TRUE(client->StoreSet("etcd-dies", "after", "written").ok());
  const ProcessResult members = cluster.daemon(2).Zeroctl({"members", "etcd-dies"});
  EXPECT_THAT(members.out, Not(AnyOf(HasSubstr("lost"), HasSubstr("left")))) << members.out;
  EXPECT_THAT(cluster.Log(0), Not(HasSubstr("electing again")));
  for (auto& rank : ranks) {
    EXPECT_THAT(rank->Output(), Not(HasSubstr("lost"))) << rank->Output();
    rank->Signal(SIGKILL);
  }
}

TEST_F(Cluster, OverAFollowersTcpPortTheViewsStillNeedATokenButItsSocketNeedsNone) {
  ZerodCluster cluster(*etcd_, absl::Seconds(10), logs_);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  // The follower's socket: its mode admitted the caller, as the leader's own socket would.
  EXPECT_EQ(cluster.daemon(1).Zeroctl({"jobs"}).exit_code, 0);
  // Its TCP port (TLS), without a token: refused by the leader, as on the leader's own port.
  const std::string address = cluster.tcp_endpoint(2);
  const ProcessResult over_tcp = RunProcess(
      {"/usr/bin/env", "-u", "ZEROD_VIEWER_TOKEN_FILE", "-u", "ZEROD_ADMIN_TOKEN_FILE",
       "ZEROD_TLS_CA=" + cluster.cluster_ca(), Built(ZEROCTL_PATH), "--endpoint", address, "jobs"});
  EXPECT_EQ(over_tcp.exit_code, 1) << over_tcp.out;
  // The leader's refusal, relayed: not a client-side failure before the follower was reached.
  EXPECT_THAT(over_tcp.err, HasSubstr("no credentials: over TCP a call needs the viewer token"))
      << over_tcp.err;
  // NodeHeartbeat is the members' own call: a follower relays no one else's, though it presents
  // its member certificate to the leader.
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadFile(cluster.cluster_ca());
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::SslCredentials(tls)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(30))));
  v1::NodeHeartbeatRequest request;
  request.add_entries()->mutable_heartbeat()->set_job_id("any");
  v1::NodeHeartbeatResponse response;
  const grpc::Status relayed = stub->NodeHeartbeat(&context, request, &response);
  EXPECT_EQ(relayed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << relayed.error_message();
  EXPECT_THAT(relayed.error_message(), HasSubstr("for the cluster's members"));
}

TEST_F(Cluster, ABadStoreUrlIsAUsageErrorAndAnEtcdMemberWithoutTcpIsRefused) {
  ZerodHarness zerod;
  const ProcessResult bad = zerod.StartRefused({"--store", "etcd://"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--store"));
  const ProcessResult other = zerod.StartRefused({"--store", "postgres://x"});
  EXPECT_EQ(other.exit_code, 2) << other.out;
  const ProcessResult no_tcp =
      zerod.StartRefused({"--store", "etcd://" + etcd_->Endpoint(0) + "/refused/"});
  EXPECT_EQ(no_tcp.exit_code, 2) << no_tcp.out;
  EXPECT_THAT(no_tcp.out, HasSubstr("--listen: a zerod on etcd needs a TCP listener"));
}

}  // namespace
}  // namespace zerod::testing
