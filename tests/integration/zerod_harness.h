#ifndef ZEROD_TESTS_INTEGRATION_ZEROD_HARNESS_H_
#define ZEROD_TESTS_INTEGRATION_ZEROD_HARNESS_H_

// Starts the real zerod binary on a temp socket and data dir, and real rank processes. Every wait
// here is scaled for the build (tests/util/test_time.h): a duration given is what it would take on
// an idle optimized build.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "nlohmann/json.hpp"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_time.h"

namespace zerod::testing {

class ZerodHarness {
 public:
  // zerod's --lease-ttl and --restart-grace default to its own defaults, scaled, unless `flags`
  // give them.
  explicit ZerodHarness(std::vector<std::string> flags = {});
  ~ZerodHarness();

  // Starts zerod (with `extra_flags` this once) and waits until it answers.
  void Start(const std::vector<std::string>& extra_flags = {});
  // Starts zerod expecting it to refuse to start: its exit code (-1 when it was still running
  // after Scaled(`timeout`); it is then killed) and its output.
  ProcessResult StartRefused(const std::vector<std::string>& extra_flags = {},
                             absl::Duration timeout = absl::Seconds(60));
  // kill -9, as a crash would.
  void Crash();
  // SIGTERM; returns the exit code.
  int Terminate();
  // Any other signal (SIGSTOP and SIGCONT, to pause the daemon).
  void Signal(int sig);

  std::string endpoint() const { return "unix://" + socket_; }
  const TempDir& dir() const { return dir_; }
  std::string data_dir() const { return dir_.path() + "/data"; }
  // The running daemon's process id (to read its /proc entries).
  pid_t daemon_pid() const { return daemon_->pid(); }
  std::string Log() const;
  // A client that retries UNAVAILABLE for `retry_for`, each call bounded by `call_timeout` (both
  // as given: tests of the retry budget time it).
  std::unique_ptr<client::CoordinatorClient> Client(
      absl::Duration retry_for = Scaled(absl::Seconds(10)),
      absl::Duration call_timeout = Scaled(absl::Seconds(10)));

  // A rank process (tests/integration/join_client) with these flags; returns it running.
  std::unique_ptr<ChildProcess> StartRank(const std::vector<std::string>& flags);
  // Waits (Scaled(`timeout`) at most) for a rank process and parses its JSON line.
  nlohmann::json Finish(ChildProcess& rank, absl::Duration timeout = absl::Seconds(60));
  // Runs zeroctl with --endpoint added, and --timeout (zeroctl's default, scaled) unless given.
  ProcessResult Zeroctl(std::vector<std::string> args);

 private:
  // zerod's command line: the harness's socket and data dir, the flags, and no TCP listener
  // unless the flags give one.
  std::vector<std::string> Argv(const std::vector<std::string>& extra_flags) const;

  TempDir dir_;
  std::string socket_;
  std::vector<std::string> flags_;
  std::unique_ptr<ChildProcess> daemon_;
  int ranks_ = 0;
};

// A binary of the build these tests belong to (its path as compiled in). With
// ZEROD_TEST_BUILD_DIR set, the same file under that folder instead: a build carried to another
// machine, as scripts/gpu-check.sh does.
std::string Built(const std::string& path);

// Polls `condition` every 50 ms until it holds (true) or Scaled(`timeout`) has passed (false).
bool Eventually(const std::function<bool()>& condition, absl::Duration timeout);

// train_mlp's summary: the last JSON line with a final_loss, possibly behind zerorun's
// "[rank 0] " prefix.
nlohmann::json TrainSummary(const std::string& out);

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_INTEGRATION_ZEROD_HARNESS_H_
