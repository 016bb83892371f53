#include "tests/integration/zerod_cluster.h"

#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/util/certificates.h"
#include "tests/util/test_time.h"

namespace zerod::testing {

std::string ZerodCluster::NodeHost(int node) { return absl::StrCat("127.0.0.", node + 1); }

ZerodCluster::ZerodCluster(EtcdCluster& etcd, absl::Duration lease_ttl, const TempDir& files,
                           absl::Duration restart_grace,
                           const std::vector<std::string>& extra_flags)
    : files_(files), pki_(files.path() + "/pki") {
  mkdir(pki_.c_str(), 0700);
  for (const std::string& error :
       {MakeCa(pki_, "zerod-cluster-ca"),
        IssueCertificate(pki_, "zerod-cluster-ca", "zerod-member", "zerod-member",
                         "IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost")}) {
    if (error_.empty()) error_ = error;
  }
  const std::string url = "etcd://" + absl::StrJoin(etcd.Endpoints(), ",") + etcd.zerod_prefix();
  for (int node = 0; node < kNodes; ++node) {
    std::vector<std::string> flags = {"--store",         url,
                                      "--listen",        absl::StrCat(NodeHost(node), ":0"),
                                      "--port-file",     port_file(node),
                                      "--node",          absl::StrCat("node-", node),
                                      "--lease-ttl",     ScaledFlag(lease_ttl),
                                      "--restart-grace", ScaledFlag(restart_grace),
                                      "--tls-cert",      member_cert(),
                                      "--tls-key",       member_key(),
                                      "--cluster-ca",    cluster_ca()};
    for (const std::string& flag : etcd.ZerodFlags()) flags.push_back(flag);
    flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
    daemons_.push_back(std::make_unique<ZerodHarness>(flags));
  }
}

std::string ZerodCluster::port_file(int node) const {
  return absl::StrCat(files_.path(), "/port", node);
}

std::string ZerodCluster::tcp_endpoint(int node) const {
  std::ifstream in(port_file(node));
  int port = 0;
  in >> port;
  return absl::StrCat(NodeHost(node), ":", port);
}

void ZerodCluster::Start() {
  ASSERT_EQ(error_, "");
  for (int node = 0; node < kNodes; ++node) {
    ASSERT_NO_FATAL_FAILURE(daemons_[node]->Start());
    if (node == 0) {
      ASSERT_TRUE(Eventually([&] { return Leads(0); }, absl::Seconds(30))) << Log(0);
    }
  }
  for (int node = 1; node < kNodes; ++node) {
    ASSERT_TRUE(Eventually([&] { return Follows(node, 0); }, absl::Seconds(30))) << Log(node);
  }
}

bool ZerodCluster::Leads(int node) const {
  return Log(node).find(absl::StrCat("node node-", node, " leads the cluster")) !=
         std::string::npos;
}

bool ZerodCluster::Follows(int node, int leader) const {
  return Log(node).find(absl::StrCat("follows the cluster's leader, node-", leader)) !=
         std::string::npos;
}

}  // namespace zerod::testing
