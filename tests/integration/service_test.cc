// zerod as a service, with the real binary: a test that plays systemd (its own NOTIFY_SOCKET)
// checks READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 and their order; the watchdog pings stop when
// the daemon's loop is stuck (ZEROD_TEST_STALL_LOOP_AFTER, a fake for tests); SIGTERM drains;
// SIGHUP reopens the log file.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The service manager's side of sd_notify: a datagram socket whose path goes to NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() { close(fd_); }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }

  // The next message, or nullopt after `timeout`.
  std::optional<std::string> Receive(absl::Duration timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) return std::nullopt;
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0) return std::nullopt;
    return std::string(buffer, static_cast<size_t>(n));
  }
  // Messages until one contains `wanted` (all of them, that one last), or every one received in
  // `limit` when none does.
  std::vector<std::string> ReceiveUntil(const std::string& wanted,
                                        absl::Duration limit = Scaled(absl::Seconds(60))) {
    std::vector<std::string> got;
    const absl::Time end = absl::Now() + limit;
    while (absl::Now() < end) {
      auto m = Receive(end - absl::Now());
      if (!m) break;
      got.push_back(*m);
      if (absl::StrContains(*m, wanted)) break;
    }
    return got;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

// Variables the test's own environment might carry (a test run under systemd), which would win
// over the ones given to the child (ChildProcess appends them).
void ClearServiceEnvironment() {
  for (const char* name : {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS",
                           "ZEROD_TEST_STALL_LOOP_AFTER", "ZEROD_CONFIG"}) {
    unsetenv(name);
  }
}

struct Daemon {
  TempDir dir;
  std::string socket = dir.path() + "/zerod.sock";
  std::string log = dir.path() + "/zerod.log";
  std::unique_ptr<ChildProcess> process;

  void Start(const std::vector<std::string>& flags, const std::vector<std::string>& env) {
    std::vector<std::string> argv = {Built(ZEROD_PATH),    "--socket", socket,
                                     "--listen",           "",         "--data-dir",
                                     dir.path() + "/data", "--no-auth"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    process = std::make_unique<ChildProcess>(argv, log, env);
  }
  std::unique_ptr<client::CoordinatorClient> Client(absl::Duration retry_for) const {
    client::ClientOptions options;
    options.endpoint = "unix://" + socket;
    options.retry_for = retry_for;
    options.call_timeout = Scaled(absl::Seconds(10));
    return *client::CoordinatorClient::Connect(options);
  }
  std::string Log() const { return ReadFile(log); }
};

// grpc.health.v1.Health/Check on 127.0.0.1:port: "SERVING", "NOT_SERVING" or the error.
std::string HealthOf(int port) {
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(10))));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (bytes == std::string("\x08\x01", 2)) return "SERVING";
  if (bytes == std::string("\x08\x02", 2)) return "NOT_SERVING";
  return "unknown answer";
}

// The last message ("" when none came).
std::string Last(const std::vector<std::string>& messages) {
  return messages.empty() ? "" : messages.back();
}

int Count(const std::vector<std::string>& messages, const std::string& what) {
  int n = 0;
  for (const std::string& m : messages) n += absl::StrContains(m, what) ? 1 : 0;
  return n;
}

TEST(Service, ReadyComesOnceTheSocketAnswersThenStatusPingsAndStoppingInThatOrder) {
  ClearServiceEnvironment();
  Daemon zerod;
  NotifySocket manager(zerod.dir.path() + "/notify.sock");
  ASSERT_TRUE(manager.bound());
  // WatchdogSec=2s (scaled): the daemon probes its loops every quarter of it, and a probe that a
  // slow build's loop answers late costs a ping.
  zerod.Start({}, {"NOTIFY_SOCKET=" + manager.path(),
                   "WATCHDOG_USEC=" + ScaledMs(absl::Seconds(2)) + "000"});

  std::vector<std::string> before_ready = manager.ReceiveUntil("READY=1");
  ASSERT_FALSE(before_ready.empty()) << zerod.Log();
  ASSERT_THAT(before_ready.back(), HasSubstr("READY=1")) << zerod.Log();
  // Told READY=1, a client is answered at once: no retries allowed.
  auto client = zerod.Client(absl::ZeroDuration());
  auto jobs = client->ListJobs();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_THAT(before_ready.front(), HasSubstr("STATUS=loading the state in"));
  EXPECT_THAT(before_ready.back(), HasSubstr("STATUS=serving: 0 job(s) open"));
  EXPECT_EQ(Count(before_ready, "WATCHDOG=1"), 0) << "a ping before READY=1";

  // Pings while the daemon's loops answer (every 500ms for WatchdogSec=2s).
  std::vector<std::string> serving;
  for (int pings = 0; pings < 2;) {
    auto m = manager.Receive(Scaled(absl::Seconds(30)));
    ASSERT_TRUE(m.has_value()) << "no WATCHDOG=1 ping; log:\n" << zerod.Log();
    serving.push_back(*m);
    pings += absl::StrContains(*m, "WATCHDOG=1") ? 1 : 0;
  }
  EXPECT_EQ(Count(serving, "READY=1"), 0);

  zerod.process->Signal(SIGTERM);
  std::vector<std::string> stopping = manager.ReceiveUntil("STATUS=stopped");
  EXPECT_EQ(zerod.process->Wait(absl::Seconds(30)), 0) << zerod.Log();
  ASSERT_FALSE(stopping.empty());
  EXPECT_THAT(stopping.back(), HasSubstr("STATUS=stopped"));
  int stopping_at = -1;
  for (size_t i = 0; i < stopping.size(); ++i) {
    if (absl::StrContains(stopping[i], "STOPPING=1")) stopping_at = static_cast<int>(i);
  }
  ASSERT_GE(stopping_at, 0) << "no STOPPING=1";
  EXPECT_THAT(stopping[static_cast<size_t>(stopping_at)], HasSubstr("STATUS=draining"));
  EXPECT_EQ(Count(stopping, "READY=1"), 0);
  // No ping once the drain started.
  for (size_t i = static_cast<size_t>(stopping_at); i < stopping.size(); ++i) {
    EXPECT_THAT(stopping[i], Not(HasSubstr("WATCHDOG=1")));
  }
}

TEST(Service, WatchdogPingsStopAndHealthSaysNotServingWhenTheDaemonsLoopIsStuck) {
  ClearServiceEnvironment();
  Daemon zerod;
  NotifySocket manager(zerod.dir.path() + "/notify.sock");
  ASSERT_TRUE(manager.bound());
  // A round every second; the timer thread gets stuck (the fake) 10s after the start, time for a
  // loaded machine to start and ping first (both scaled).
  zerod.Start(
      {"--health-listen", "127.0.0.1:0"},
      {"NOTIFY_SOCKET=" + manager.path(), "WATCHDOG_USEC=" + ScaledMs(absl::Seconds(4)) + "000",
       "ZEROD_TEST_STALL_LOOP_AFTER=" + ScaledFlag(absl::Seconds(10))});
  ASSERT_THAT(Last(manager.ReceiveUntil("READY=1")), HasSubstr("READY=1")) << zerod.Log();
  // (No std::regex: GCC 12's ASan build warns inside it, -Wmaybe-uninitialized.)
  const std::string log = zerod.Log();
  const std::string listening = "health listening on 127.0.0.1:";
  const size_t at = log.find(listening);
  ASSERT_NE(at, std::string::npos) << log;
  const int health_port = std::atoi(log.c_str() + at + listening.size());
  ASSERT_GT(health_port, 0) << log;

  ASSERT_THAT(Last(manager.ReceiveUntil("WATCHDOG=1")), HasSubstr("WATCHDOG=1"))
      << "no ping while the loops answer; log:\n"
      << zerod.Log();
  EXPECT_TRUE(Eventually([&] { return HealthOf(health_port) == "SERVING"; }, absl::Seconds(60)))
      << HealthOf(health_port);

  // Stuck: the watchdog says so once, and from then on no ping comes.
  ASSERT_TRUE(Eventually([&] { return absl::StrContains(zerod.Log(), "loops do not answer"); },
                         absl::Seconds(60)))
      << zerod.Log();
  EXPECT_THAT(zerod.Log(), HasSubstr("registry's timer thread"));
  while (manager.Receive(absl::ZeroDuration())) {
  }
  // Four rounds (one WatchdogSec, scaled) without a ping.
  const std::vector<std::string> stuck =
      manager.ReceiveUntil("WATCHDOG=1", Scaled(absl::Seconds(4)));
  EXPECT_EQ(Count(stuck, "WATCHDOG=1"), 0) << "pinged while the loop is stuck";
  EXPECT_EQ(HealthOf(health_port), "NOT_SERVING");

  // The drain releases the stuck thread; the daemon still stops cleanly.
  zerod.process->Signal(SIGTERM);
  EXPECT_EQ(zerod.process->Wait(absl::Seconds(30)), 0) << zerod.Log();
}

client::JoinOptions OneRankJob(const std::string& job) {
  client::JoinOptions o;
  o.job_id = job;
  o.world_size = 1;
  o.rank = 0;
  o.host = "test-host";
  o.device = "cpu:0";
  o.layout = plan::SyntheticLayout(1 << 16, DType::kBFloat16, 4);
  o.plan_options.stage = 2;
  return o;
}

TEST(Service, SigtermAnswersInFlightCallsTellsWatchersAndKeepsEveryAcknowledgedWrite) {
  ZerodHarness zerod({"--no-auth"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  ASSERT_TRUE(zerod.Client()->Join(OneRankJob("drain"), Scaled(absl::Seconds(30))).ok());

  // Calls that would outlast the drain by far, were they not answered by it.
  client::ClientOptions no_retry;
  no_retry.endpoint = zerod.endpoint();
  no_retry.retry_for = absl::ZeroDuration();
  no_retry.call_timeout = Scaled(absl::Seconds(60));
  absl::Status waited, watched;
  std::thread waiter([&] {
    waited = (*client::CoordinatorClient::Connect(no_retry))
                 ->StoreWait("drain", {"never-set"}, Scaled(absl::Seconds(60)));
  });
  std::atomic<bool> watching{false};
  std::thread watcher([&] {
    watched =
        (*client::CoordinatorClient::Connect(no_retry))->Watch("drain", [&](const v1::JobEvent&) {
          watching = true;
          return true;
        });
  });
  // Writers keep writing until the daemon stops answering; each remembers its last acknowledged
  // value.
  constexpr int kWriters = 3;
  std::vector<std::atomic<int64_t>> acknowledged(kWriters);  // read while the writers write
  for (auto& a : acknowledged) a = -1;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto client = *client::CoordinatorClient::Connect(no_retry);
      for (int64_t i = 0;; ++i) {
        if (!client->StoreSet("drain", "w" + std::to_string(w), std::to_string(i)).ok()) return;
        acknowledged[static_cast<size_t>(w)] = i;
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return watching.load(); }, absl::Seconds(60)));
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& a : acknowledged) {
          if (a.load() < 10) return false;
        }
        return true;
      },
      absl::Seconds(60)));
  const absl::Time signalled = absl::Now();
  EXPECT_EQ(zerod.Terminate(), 0) << zerod.Log();
  waiter.join();
  watcher.join();
  for (auto& t : writers) t.join();
  // Within the bound (--drain-timeout 10s + 5s for the flush), with room for a loaded machine and
  // a slower build, and well before the calls' own deadlines.
  EXPECT_LT(absl::Now() - signalled, Scaled(absl::Seconds(20)));
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("shutting down"));
  EXPECT_EQ(watched.code(), absl::StatusCode::kUnavailable) << watched;
  EXPECT_THAT(std::string(watched.message()), HasSubstr("shutting down"));
  EXPECT_THAT(zerod.Log(), HasSubstr("state flushed and closed"));

  // Every write the daemon acknowledged is there after a restart.
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  for (int w = 0; w < kWriters; ++w) {
    auto value = client->StoreGet("drain", "w" + std::to_string(w), absl::ZeroDuration());
    ASSERT_TRUE(value.ok()) << value.status();
    EXPECT_GE(std::stoll(*value), acknowledged[static_cast<size_t>(w)].load()) << "writer " << w;
  }
}

TEST(Service, SighupReopensTheLogFileSoLinesGoToTheNewOneAfterARotation) {
  ZerodHarness zerod({"--no-auth"});
  const std::string file = zerod.dir().path() + "/service.log";
  ASSERT_NO_FATAL_FAILURE(zerod.Start({"--log-file", file}));
  EXPECT_THAT(ReadFile(file), HasSubstr("listening on unix:"));
  ASSERT_EQ(std::rename(file.c_str(), (file + ".1").c_str()), 0);
  zerod.Signal(SIGHUP);
  ASSERT_TRUE(Eventually([&] { return absl::StrContains(ReadFile(file), "log file reopened"); },
                         absl::Seconds(60)))
      << ReadFile(file + ".1") << zerod.Log();
  ASSERT_TRUE(zerod.Client()->Join(OneRankJob("rotated"), Scaled(absl::Seconds(30))).ok());
  EXPECT_TRUE(Eventually([&] { return absl::StrContains(ReadFile(file), "job rotated"); },
                         absl::Seconds(60)));
  EXPECT_THAT(ReadFile(file + ".1"), Not(HasSubstr("job rotated")));
  EXPECT_EQ(zerod.Terminate(), 0);
  EXPECT_THAT(ReadFile(file), HasSubstr("stopped"));
}

}  // namespace
}  // namespace zerod::testing
