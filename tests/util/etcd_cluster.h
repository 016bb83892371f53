#ifndef ZEROD_TESTS_UTIL_ETCD_CLUSTER_H_
#define ZEROD_TESTS_UTIL_ETCD_CLUSTER_H_

// A real etcd cluster for tests: N members of /usr/bin/etcd (Debian's etcd-server, installed by
// scripts/setup.sh) on free loopback ports, each with its own data dir under a temp dir, with
// short heartbeat and election timeouts so that a lost leader is replaced within a second or so.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {

class EtcdCluster {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  // Whether etcd is installed; tests GTEST_SKIP naming scripts/setup.sh when it is not.
  static bool Installed();

  // Starts `members` members and waits until they have a leader; error() says why not.
  explicit EtcdCluster(int members);
  ~EtcdCluster();  // kills every member
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Empty when the cluster started and elected a leader.
  const std::string& error() const { return error_; }
  // Every member's client address, "127.0.0.1:port".
  std::vector<std::string> Endpoints() const;
  std::string Endpoint(int member) const;
  // The index of the member that leads, once one does within `timeout`; -1 otherwise.
  int Leader(absl::Duration timeout = absl::Seconds(30));
  void Kill(int member);     // SIGKILL, no goodbye
  void Restart(int member);  // the same name, ports and data dir
  bool Running(int member);
  // The member's log (etcd writes errors only).
  std::string Log(int member) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log_path;
    std::unique_ptr<ChildProcess> process;
  };
  void Start(int member, const std::string& state);

  TempDir dir_;
  std::string initial_cluster_;
  std::string token_;
  std::vector<Member> members_;
  std::string error_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_ETCD_CLUSTER_H_
