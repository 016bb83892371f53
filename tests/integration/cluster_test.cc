// A zerod on every node: three real zerods (each its own socket, data dir and node name) on a real
// 3-member etcd (--store etcd://...), one leading and two forwarding to it; train_mlp ranks, two
// per daemon, each talking only to its own node's daemon. A killed follower, a killed leader, a
// killed etcd leader (docs/ARCHITECTURE.md, "A zerod on every node").

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

constexpr int kNodes = 3;
constexpr int kRanksPerNode = 2;
constexpr int kWorld = kNodes * kRanksPerNode;

std::string NodeHost(int node) { return absl::StrCat("127.0.0.", node + 1); }

// Three zerods on one etcd state. Node 0 starts first, so it leads; the others follow it.
class ZerodCluster {
 public:
  // Each daemon writes its TCP port (the leader's, or its forwarder's) to port_file(node).
  // `restart_grace`: what a new leader adds to the recovered leases (zerod's default is 10s).
  ZerodCluster(EtcdCluster& etcd, const std::string& lease_ttl, const TempDir& files,
               const std::string& restart_grace = "1s")
      : files_(files) {
    const std::string url = "etcd://" + absl::StrJoin(etcd.Endpoints(), ",") + "/zerod-test/";
    for (int node = 0; node < kNodes; ++node) {
      daemons_.push_back(std::make_unique<ZerodHarness>(std::vector<std::string>{
          // Each node on its own address (all of 127/8 is loopback), which its ranks learn at
          // the join and listen on for their peers.
          "--store", url, "--listen", absl::StrCat(NodeHost(node), ":0"), "--port-file",
          port_file(node), "--node", absl::StrCat("node-", node), "--lease-ttl", lease_ttl,
          "--restart-grace", restart_grace}));
    }
  }
  std::string port_file(int node) const { return absl::StrCat(files_.path(), "/port", node); }

  void Start() {
    for (int node = 0; node < kNodes; ++node) {
      ASSERT_NO_FATAL_FAILURE(daemons_[node]->Start());
      if (node == 0) {
        ASSERT_TRUE(Eventually([&] { return Leads(0); }, absl::Seconds(30))) << Log(0);
      }
    }
    for (int node = 1; node < kNodes; ++node) {
      ASSERT_TRUE(Eventually(
          [&] {
            return Log(node).find("follows the cluster's leader, node-0") != std::string::npos;
          },
          absl::Seconds(30)))
          << Log(node);
    }
  }

  bool Leads(int node) const {
    return Log(node).find(absl::StrCat("node node-", node, " leads the cluster")) !=
           std::string::npos;
  }
  ZerodHarness& daemon(int node) { return *daemons_[node]; }
  std::string Log(int node) const { return daemons_[node]->Log(); }

 private:
  const TempDir& files_;
  std::vector<std::unique_ptr<ZerodHarness>> daemons_;
};

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
                                 // SDK's default (60s). 5s was once too short in CI.
                                 "ZEROD_RETRY_FOR=30s"}));
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
    if (!EtcdCluster::Installed()) GTEST_SKIP() << "needs /usr/bin/etcd (scripts/setup.sh)";
    etcd_ = std::make_unique<EtcdCluster>(3);
    ASSERT_EQ(etcd_->error(), "");
  }
  std::unique_ptr<EtcdCluster> etcd_;
  TempDir logs_;
};

TEST_F(Cluster, SixRanksOnThreeDaemonsTrainToTheUnshardedLossAndEveryDaemonShowsTheWholeJob) {
  ZerodCluster cluster(*etcd_, "10s", logs_);
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

// The killed node's ranks are lost one lease after its death. 4s, not less: under ThreadSanitizer
// on two cores a live rank's heartbeats could be 2s apart while the session started.
constexpr char kShortLease[] = "4s";

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
  // again) within the lease and the grace the recovery gives them: 1s of grace lost a survivor
  // now and then under the sanitizers on a loaded machine (rank 3, "rank 0, 1, 3 were lost").
  ZerodCluster cluster(*etcd_, kShortLease, logs_, /*restart_grace=*/"3s");
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
  ZerodCluster cluster(*etcd_, "6s", logs_);
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
  ZerodCluster cluster(*etcd_, "10s", logs_);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  // The follower's socket: its mode admitted the caller, as the leader's own socket would.
  EXPECT_EQ(cluster.daemon(1).Zeroctl({"jobs"}).exit_code, 0);
  // Its TCP port, without a token: refused by the leader, as on the leader's own port.
  std::ifstream port_in(cluster.port_file(2));
  int port = 0;
  port_in >> port;
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat(NodeHost(2), ":", port);
  const ProcessResult over_tcp =
      RunProcess({"/usr/bin/env", "-u", "ZEROD_VIEWER_TOKEN_FILE", "-u", "ZEROD_ADMIN_TOKEN_FILE",
                  Built(ZEROCTL_PATH), "--endpoint", address, "jobs"});
  EXPECT_EQ(over_tcp.exit_code, 1) << over_tcp.out;
  // The leader's refusal, relayed: not a client-side failure before the follower was reached.
  EXPECT_THAT(over_tcp.err, HasSubstr("no credentials: over TCP a call needs the viewer token"))
      << over_tcp.err;
  // NodeHeartbeat is the members' own call: a follower relays no one else's, though it adds the
  // cluster's secret to what it relays.
  auto stub =
      v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
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
