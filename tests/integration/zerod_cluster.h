#ifndef ZEROD_TESTS_INTEGRATION_ZEROD_CLUSTER_H_
#define ZEROD_TESTS_INTEGRATION_ZEROD_CLUSTER_H_

// Three real zerods on one etcd state (--store etcd://), secured as docs/operators.md says: each
// speaks TLS to etcd as etcd's user zerod (EtcdCluster's certificates, when it has them) and
// mutual TLS to the others with a member certificate of the cluster's own CA (deploy/etcd/certs.sh;
// one certificate for every node, naming 127.0.0.1-3 and localhost). Node n listens on 127.0.0.n+1
// (all of 127/8 is loopback), which its ranks learn at the join and listen on for their peers.
// Node 0 starts first, so it leads; the others follow it.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/etcd_cluster.h"

namespace zerod::testing {

class ZerodCluster {
 public:
  static constexpr int kNodes = 3;
  static std::string NodeHost(int node);

  // Each daemon writes its TCP port (the leader's, or its forwarder's) to port_file(node).
  // `restart_grace`: what a new leader adds to the recovered leases (zerod's default is 10s). Both
  // durations are scaled for the build (tests/util/test_time.h); the lease is also the leader's
  // claim on the cluster. `extra_flags` go to every daemon. The certificates go under `files`.
  ZerodCluster(EtcdCluster& etcd, absl::Duration lease_ttl, const TempDir& files,
               absl::Duration restart_grace = absl::Seconds(1),
               const std::vector<std::string>& extra_flags = {});
  // Empty when the certificates were made.
  const std::string& error() const { return error_; }

  std::string port_file(int node) const;
  // "127.0.0.n+1:port" of node's TCP listener (0 before it wrote its port).
  std::string tcp_endpoint(int node) const;
  // The cluster's CA, which a TCP client trusts (ZEROD_TLS_CA), and the member certificate.
  std::string cluster_ca() const { return pki_ + "/zerod-cluster-ca.pem"; }
  std::string member_cert() const { return pki_ + "/zerod-member.pem"; }
  std::string member_key() const { return pki_ + "/zerod-member.key"; }
  const std::string& pki() const { return pki_; }

  void Start();
  bool Leads(int node) const;
  // Whether `node` follows node `leader`.
  bool Follows(int node, int leader) const;
  ZerodHarness& daemon(int node) { return *daemons_[node]; }
  std::string Log(int node) const { return daemons_[node]->Log(); }

 private:
  const TempDir& files_;
  std::string pki_;
  std::string error_;
  std::vector<std::unique_ptr<ZerodHarness>> daemons_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_INTEGRATION_ZEROD_CLUSTER_H_
