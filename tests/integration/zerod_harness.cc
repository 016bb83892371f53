#include "tests/integration/zerod_harness.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zerod::testing {
namespace {

// Whether a plain connect to the Unix socket at `path` is accepted (something listens there).
bool Accepts(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  const bool accepted = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return accepted;
}

}  // namespace

ZerodHarness::ZerodHarness(std::vector<std::string> flags)
    : socket_(dir_.path() + "/zerod.sock"), flags_(std::move(flags)) {}

ZerodHarness::~ZerodHarness() = default;

std::vector<std::string> ZerodHarness::Argv(const std::vector<std::string>& extra_flags) const {
  std::vector<std::string> argv = {Built(ZEROD_PATH), "--socket", socket_, "--data-dir",
                                   dir_.path() + "/data"};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  const auto given = [&argv](const char* flag) {
    return std::find(argv.begin(), argv.end(), flag) != argv.end();
  };
  // No TCP listener unless the test gives one.
  if (!given("--listen")) argv.insert(argv.end(), {"--listen", ""});
  // zerod's defaults, scaled: a slow build's live ranks keep their leases.
  if (!given("--lease-ttl")) {
    argv.insert(argv.end(), {"--lease-ttl", ScaledFlag(absl::Seconds(10))});
  }
  if (!given("--restart-grace")) {
    argv.insert(argv.end(), {"--restart-grace", ScaledFlag(absl::Seconds(10))});
  }
  return argv;
}

void ZerodHarness::Start(const std::vector<std::string>& extra_flags) {
  const std::vector<std::string> argv = Argv(extra_flags);
  std::remove(socket_.c_str());  // a killed daemon's socket; the new one replaces it
  daemon_ = std::make_unique<ChildProcess>(argv, dir_.path() + "/zerod.log");
  // A channel refused once (before the daemon listens) goes into reconnect backoff, and once in
  // a while stayed refused after the daemon listened: the client connects once a plain connect is
  // accepted.
  const absl::Time deadline = absl::Now() + Scaled(absl::Seconds(10));
  while (!Accepts(socket_) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  auto client = Client();
  auto jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status() << "\n" << Log();
}

ProcessResult ZerodHarness::StartRefused(const std::vector<std::string>& extra_flags,
                                         absl::Duration timeout) {
  const std::vector<std::string> argv = Argv(extra_flags);
  std::remove(socket_.c_str());
  ChildProcess daemon(argv, dir_.path() + "/zerod-refused.log");
  ProcessResult result;
  result.exit_code = daemon.Wait(timeout);
  result.out = daemon.Output();
  return result;  // a daemon still running is killed here
}

bool Eventually(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

void ZerodHarness::Signal(int sig) { daemon_->Signal(sig); }

void ZerodHarness::Crash() {
  daemon_->Signal(SIGKILL);
  daemon_->Wait(absl::Seconds(10));
}

int ZerodHarness::Terminate() {
  daemon_->Signal(SIGTERM);
  return daemon_->Wait(absl::Seconds(20));
}

std::string ZerodHarness::Log() const {
  std::ifstream in(dir_.path() + "/zerod.log");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<client::CoordinatorClient> ZerodHarness::Client(absl::Duration retry_for,
                                                                absl::Duration call_timeout) {
  client::ClientOptions options;
  options.endpoint = endpoint();
  options.retry_for = retry_for;
  options.call_timeout = call_timeout;
  return *client::CoordinatorClient::Connect(options);
}

std::unique_ptr<ChildProcess> ZerodHarness::StartRank(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {Built(JOIN_CLIENT_PATH), "--endpoint", endpoint()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return std::make_unique<ChildProcess>(argv,
                                        dir_.path() + "/rank" + std::to_string(ranks_++) + ".log");
}

nlohmann::json ZerodHarness::Finish(ChildProcess& rank, absl::Duration timeout) {
  const int code = rank.Wait(timeout);
  const std::string out = rank.Output();
  EXPECT_NE(code, -1) << "rank process did not finish: " << out;
  const size_t line = out.rfind('{');
  if (line == std::string::npos) {
    ADD_FAILURE() << "no JSON from rank process (exit " << code << "): " << out;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(out.substr(line));
}

ProcessResult ZerodHarness::Zeroctl(std::vector<std::string> args) {
  args.insert(args.begin(), Built(ZEROCTL_PATH));
  if (std::find(args.begin(), args.end(), "--timeout") == args.end()) {
    args.insert(args.end(), {"--timeout", ScaledFlag(absl::Seconds(10))});
  }
  args.push_back("--endpoint");
  args.push_back(endpoint());
  return RunProcess(args);
}

std::string Built(const std::string& path) {
  const char* moved = std::getenv("ZEROD_TEST_BUILD_DIR");
  const std::string built_in = ZEROD_TEST_BUILT_IN;
  if (moved == nullptr || *moved == '\0' || path.rfind(built_in + "/", 0) != 0) return path;
  return std::string(moved) + path.substr(built_in.size());
}

nlohmann::json TrainSummary(const std::string& out) {
  size_t end = out.size();
  while (end > 0) {
    const size_t begin = out.rfind('\n', end - 1);
    const size_t start = begin == std::string::npos ? 0 : begin + 1;
    const std::string line = out.substr(start, end - start);
    const size_t brace = line.find('{');
    if (brace != std::string::npos && line.find("\"final_loss\"") != std::string::npos) {
      return nlohmann::json::parse(line.substr(brace));
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  ADD_FAILURE() << "no summary line in: " << out;
  return nlohmann::json::object();
}

}  // namespace zerod::testing
