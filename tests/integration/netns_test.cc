// Ranks on two network stacks: two network namespaces joined by a veth pair (made by the test;
// it needs root and iproute2, and says why it skips otherwise), each node's ranks in its own,
// each node's zerod telling its ranks the node's address (--node-address). Gloo's pairs then
// cross the veth between 10.213.0.1 and 10.213.0.2: ranks that listened anywhere else (127.0.0.1,
// the default) could not meet. The zerods and etcd stay in the test's namespace: a rank reaches
// its node's zerod through the zerod's Unix socket, a file, which every namespace sees.

#include <unistd.h>

#include <functional>
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
#include "tests/util/certificates.h"
#include "tests/util/etcd_cluster.h"

namespace zerod::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kNodes = 2;
constexpr int kRanksPerNode = 2;
constexpr int kWorld = kNodes * kRanksPerNode;

// iproute2's ip (the tests start programs by path, not through $PATH); empty when not installed.
std::string IpPath() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Two network namespaces and a veth pair between them, removed with the object.
class NamespacePair {
 public:
  NamespacePair() {
    const std::string id = std::to_string(getpid());
    for (int node = 0; node < kNodes; ++node) {
      names_.push_back(absl::StrCat("zerod-test-", id, "-", node));
    }
    const std::string a = "zd" + id + "a", b = "zd" + id + "b";  // at most 15 characters
    const std::string ip = IpPath();
    const std::vector<std::vector<std::string>> commands = {
        {ip, "netns", "add", names_[0]},
        {ip, "netns", "add", names_[1]},
        {ip, "link", "add", a, "netns", names_[0], "type", "veth", "peer", "name", b, "netns",
         names_[1]},
        {ip, "-n", names_[0], "addr", "add", Address(0) + "/24", "dev", a},
        {ip, "-n", names_[1], "addr", "add", Address(1) + "/24", "dev", b},
        {ip, "-n", names_[0], "link", "set", a, "up"},
        {ip, "-n", names_[1], "link", "set", b, "up"},
        {ip, "-n", names_[0], "link", "set", "lo", "up"},
        {ip, "-n", names_[1], "link", "set", "lo", "up"},
        // What the ranks are started with (it remounts /sys, which some containers refuse).
        {ip, "netns", "exec", names_[0], "/bin/true"}};
    for (const auto& command : commands) {
      const ProcessResult r = RunProcess(command);
      if (r.exit_code != 0) {
        error_ = absl::StrCat(absl::StrJoin(command, " "), ": exit ", r.exit_code, ": ", r.err);
        return;
      }
    }
  }
  ~NamespacePair() {
    for (const std::string& name : names_) RunProcess({IpPath(), "netns", "del", name});
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  const std::string& error() const { return error_; }
  const std::string& name(int node) const { return names_[node]; }
  static std::string Address(int node) { return absl::StrCat("10.213.0.", node + 1); }

 private:
  std::vector<std::string> names_;
  std::string error_;
};

TEST(NetworkNamespaces, RanksOnTwoNetworkStacksMeetWhereTheirZerodsSayAndTrainToTheUnshardedLoss) {
  if (!EtcdCluster::Installed(/*with_etcdctl=*/true)) {
    GTEST_SKIP() << "needs /usr/bin/etcd and /usr/bin/etcdctl (scripts/setup.sh)";
  }
  if (geteuid() != 0 || IpPath().empty()) {
    GTEST_SKIP() << "needs root and iproute2's ip to make network namespaces";
  }
  NamespacePair namespaces;
  if (!namespaces.error().empty()) {
    GTEST_SKIP() << "this machine does not let the test make network namespaces: "
                 << namespaces.error();
  }
  // Secured as docs/operators.md says: etcd with TLS and authentication, members with
  // certificates of the cluster's CA.
  EtcdCluster etcd(1, EtcdSecurity{.tls = true, .auth = true, .zerod_prefix = "/zerod-netns/"});
  ASSERT_EQ(etcd.error(), "");
  TempDir pki;
  ASSERT_EQ(MakeCa(pki.path(), "cluster-ca"), "");
  ASSERT_EQ(IssueCertificate(pki.path(), "cluster-ca", "member", "zerod-member",
                             "IP:127.0.0.1,IP:127.0.0.2"),
            "");
  const std::string url = "etcd://" + etcd.Endpoint(0) + "/zerod-netns/";
  std::vector<std::unique_ptr<ZerodHarness>> daemons;
  for (int node = 0; node < kNodes; ++node) {
    std::vector<std::string> flags = {"--store",        url,
                                      "--listen",       absl::StrCat("127.0.0.", node + 1, ":0"),
                                      "--node",         absl::StrCat("node-", node),
                                      "--node-address", NamespacePair::Address(node),
                                      "--tls-cert",     pki.path() + "/member.pem",
                                      "--tls-key",      pki.path() + "/member.key",
                                      "--cluster-ca",   pki.path() + "/cluster-ca.pem"};
    for (const std::string& flag : etcd.ZerodFlags()) flags.push_back(flag);
    daemons.push_back(std::make_unique<ZerodHarness>(flags));
    ASSERT_NO_FATAL_FAILURE(daemons[node]->Start());
    // Node 0 leads before node 1 starts, so node 1's ranks go through a follower.
    const std::string role =
        node == 0 ? "node node-0 leads the cluster" : "follows the cluster's leader, node-0";
    ASSERT_TRUE(Eventually([&] { return daemons[node]->Log().find(role) != std::string::npos; },
                           absl::Seconds(30)))
        << daemons[node]->Log();
  }

  const std::vector<std::string> args = {"--stage", "2", "--steps", "4", "--seed", "5"};
  std::vector<std::string> reference_argv = {Built(TRAIN_MLP_PATH), "--reference", "--world",
                                             std::to_string(kWorld)};
  reference_argv.insert(reference_argv.end(), args.begin() + 2, args.end());
  const ProcessResult reference = RunProcess(reference_argv);
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const double want = TrainSummary(reference.out)["final_loss"].get<double>();

  const std::string job = "two-stacks";
  ASSERT_TRUE(client::JobTokenOrNew(job).ok());
  TempDir logs;
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    const int node = r / kRanksPerNode;
    std::vector<std::string> argv = {IpPath(), "netns", "exec", namespaces.name(node),
                                     Built(TRAIN_MLP_PATH)};
    argv.insert(argv.end(), args.begin(), args.end());
    ranks.push_back(std::make_unique<ChildProcess>(
        argv, absl::StrCat(logs.path(), "/rank", r, ".log"),
        std::vector<std::string>{"ZEROD_ENDPOINT=" + daemons[node]->endpoint(), "ZEROD_JOB=" + job,
                                 absl::StrCat("ZEROD_RANK=", r),
                                 absl::StrCat("ZEROD_WORLD_SIZE=", kWorld)}));
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(ranks[r]->Wait(absl::Seconds(180)), 0) << "rank " << r << ": " << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(),
                HasSubstr(absl::StrCat("rank ", r, " of ", kWorld, ": peers reach it at ",
                                       NamespacePair::Address(r / kRanksPerNode), "\n")));
  }
  const double got = TrainSummary(ranks[0]->Output())["final_loss"].get<double>();
  EXPECT_NEAR(got, want, 1e-5 * want);
}

}  // namespace
}  // namespace zerod::testing
