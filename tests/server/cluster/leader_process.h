#ifndef ZEROD_TESTS_SERVER_CLUSTER_LEADER_PROCESS_H_
#define ZEROD_TESTS_SERVER_CLUSTER_LEADER_PROCESS_H_

// A cluster's leader for the server/cluster tests: the real zerod binary on a Unix socket and TCP
// loopback (port 0, read back from its port file), in its own temp dir, its lease zerod's default
// scaled for the build (tests/util/test_time.h).

#include <memory>
#include <string>
#include <vector>

#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace zerod::server::cluster {

class LeaderProcess {
 public:
  explicit LeaderProcess(std::vector<std::string> flags = {"--no-auth"});

  int port() const { return port_; }
  std::string tcp_endpoint() const;
  std::string socket() const { return dir_.path() + "/zerod.sock"; }
  std::string Log() const { return daemon_->Output(); }
  void Crash();

 private:
  zerod::testing::TempDir dir_;
  std::unique_ptr<zerod::testing::ChildProcess> daemon_;
  int port_ = 0;
};

}  // namespace zerod::server::cluster

#endif  // ZEROD_TESTS_SERVER_CLUSTER_LEADER_PROCESS_H_
