#include "tests/server/cluster/leader_process.h"

#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::server::cluster {

LeaderProcess::LeaderProcess(std::vector<std::string> flags) {
  const std::string port_file = dir_.path() + "/port";
  std::vector<std::string> argv = {zerod::testing::Built(ZEROD_PATH),
                                   "--socket",
                                   socket(),
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port-file",
                                   port_file,
                                   "--data-dir",
                                   dir_.path() + "/data",
                                   "--lease-ttl",
                                   zerod::testing::ScaledFlag(absl::Seconds(10))};
  argv.insert(argv.end(), flags.begin(), flags.end());
  daemon_ = std::make_unique<zerod::testing::ChildProcess>(argv, dir_.path() + "/zerod.log");
  for (int i = 0; i < 6000; ++i) {
    struct stat st {};
    if (stat(port_file.c_str(), &st) == 0 && st.st_size > 0) break;
    if (daemon_->Wait(absl::Milliseconds(5)) != -1) break;
  }
  std::ifstream in(port_file);
  in >> port_;
}

std::string LeaderProcess::tcp_endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

void LeaderProcess::Crash() {
  daemon_->Signal(SIGKILL);
  daemon_->Wait(absl::Seconds(10));
}

}  // namespace zerod::server::cluster
