// Authentication and authorization against the real zerod: another Unix user (nobody, through
// runuser) cannot act on a job it does not hold the token of, over the Unix socket or TCP; the
// owner and the admin can end it; zerorun carries the token by itself; TLS on the TCP listener.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/other_user.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kUnauthenticated = 16;
constexpr int kPermissionDenied = 7;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A zerod on a Unix socket that every user may connect to (so that the tokens are what stands in
// the way) and on TCP loopback, with its data dir and the test's config dir under one temp dir
// that nobody can traverse.
class AuthDaemon {
 public:
  AuthDaemon() {
    chmod(dir_.path().c_str(), 0755);
    // The SDK in this process and the tools it starts save and find job tokens here.
    setenv("XDG_CONFIG_HOME", (dir_.path() + "/config").c_str(), 1);
  }

  // Starts zerod with `flags` added; returns its exit code if it stops on its own within
  // `refused_within` (a refused start), else -1 once it answers.
  int Start(std::vector<std::string> flags = {}, std::string listen = "127.0.0.1:0",
            std::string socket_mode = "0666") {
    std::remove(port_file().c_str());
    std::vector<std::string> argv = {
        Built(ZEROD_PATH), "--socket",    socket(),      "--socket-mode", socket_mode,
        "--listen",        listen,        "--port-file", port_file(),     "--data-dir",
        data_dir(),        "--lease-ttl", "60s"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    daemon_ = std::make_unique<ChildProcess>(argv, dir_.path() + "/zerod.log");
    for (int i = 0; i < 4000; ++i) {
      struct stat st {};
      if (stat(port_file().c_str(), &st) == 0 && st.st_size > 0) break;
      if (const int code = daemon_->Wait(absl::Milliseconds(5)); code != -1) return code;
    }
    port_ = std::atoi(ReadFile(port_file()).c_str());
    return -1;
  }
  int Stop() {
    daemon_->Signal(SIGTERM);
    return daemon_->Wait(absl::Seconds(20));
  }

  std::string socket() const { return dir_.path() + "/zerod.sock"; }
  std::string port_file() const { return dir_.path() + "/port"; }
  std::string data_dir() const { return dir_.path() + "/data"; }
  std::string admin_token_file() const { return data_dir() + "/admin.token"; }
  std::string unix_endpoint() const { return "unix://" + socket(); }
  std::string tcp_endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string config_dir() const { return dir_.path() + "/config/zerod"; }
  const TempDir& dir() const { return dir_; }
  std::string Log() const { return daemon_ ? daemon_->Output() : ""; }

  std::unique_ptr<client::CoordinatorClient> Client(client::ClientOptions options) const {
    if (options.endpoint.empty()) options.endpoint = unix_endpoint();
    options.retry_for = Scaled(absl::Seconds(10));
    options.call_timeout = Scaled(options.call_timeout);
    auto c = client::CoordinatorClient::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
  std::unique_ptr<client::CoordinatorClient> ClientWithToken(const std::string& token) const {
    client::ClientOptions options;
    options.job_token = token;
    return Client(options);
  }

 private:
  TempDir dir_;
  std::unique_ptr<ChildProcess> daemon_;
  int port_ = 0;
};

// Runs tests/integration/auth_probe as the user nobody, with nothing of this process's
// environment (no token, no config dir) but a sanitizer build's options, and returns its
// {"code", "message"}.
nlohmann::json ProbeAsNobody(const std::vector<std::string>& args) {
  return RunProbe(/*as_nobody=*/true, Built(AUTH_PROBE_PATH), args);
}

TEST(Auth, AnotherUserCanNeitherActAsARankNorUseTheStoreNorEndAJobOverTheSocketOrTcp) {
  AuthDaemon zerod;
  ASSERT_EQ(zerod.Start(), -1) << zerod.Log();
  const std::string token = client::NewToken();
  auto owner = zerod.ClientWithToken(token);
  auto membership = owner->Join(OneRankJob("victim"), Scaled(absl::Seconds(30)));
  ASSERT_TRUE(membership.ok()) << membership.status();
  ASSERT_TRUE(owner->StoreSet("victim", "k", "owned").ok());
  const std::string wrong = client::NewToken();

  for (const std::string& endpoint : {zerod.unix_endpoint(), zerod.tcp_endpoint()}) {
    for (const char* call : {"set", "get", "delete", "add", "compare-set", "wait", "barrier",
                             "heartbeat", "leave", "end", "join"}) {
      for (const std::string& presented : {std::string(), wrong}) {
        SCOPED_TRACE(absl::StrCat(endpoint, " ", call, presented.empty() ? " (no token)" : ""));
        // The join copies the member's host and device, as `zeroctl members` shows them.
        const nlohmann::json r = ProbeAsNobody({"--endpoint", endpoint, "--job", "victim", "--call",
                                                call, "--rank", "0", "--key", "k", "--token",
                                                presented, "--host", "node-a", "--device", "cpu"});
        EXPECT_EQ(r.value("code", 0), presented.empty() ? kUnauthenticated : kPermissionDenied)
            << r.dump();
        const std::string message = r.value("message", "");
        EXPECT_THAT(message, HasSubstr("job victim"));
        if (!presented.empty()) {
          EXPECT_THAT(message, Not(HasSubstr(presented)));
        }
      }
    }
  }

  // Nothing changed: the job runs with its member, its keys are as the owner left them.
  auto job = owner->DescribeJob("victim");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->summary().state(), v1::JOB_RUNNING);
  ASSERT_EQ(job->members_size(), 1);
  EXPECT_EQ(job->members(0).state(), v1::MEMBER_ACTIVE);
  auto value = owner->StoreGet("victim", "k", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "owned");
  EXPECT_FALSE(owner->StoreGet("victim", "k-counter", absl::ZeroDuration()).ok());
  EXPECT_TRUE(owner->Heartbeat("victim", 0, membership->generation, {}).ok());
  // Read-only inspection stays open to whoever may connect.
  EXPECT_EQ(
      ProbeAsNobody({"--endpoint", zerod.unix_endpoint(), "--job", "victim", "--call", "describe"})
          .value("code", -1),
      0);
}

TEST(Auth, TheOwnersZeroctlFindsTheSavedTokenAndTheAdminMayEndAnyJob) {
  AuthDaemon zerod;
  ASSERT_EQ(zerod.Start(), -1) << zerod.Log();
  // The SDK makes and saves a token for a job its user creates (XDG_CONFIG_HOME: the test's).
  auto owner = zerod.Client({});
  ASSERT_TRUE(owner->Join(OneRankJob("mine"), Scaled(absl::Seconds(30))).ok());
  ASSERT_TRUE(owner->StoreSet("mine", "k", "v").ok());
  const std::string saved = zerod.config_dir() + "/jobs/mine.token";
  struct stat st {};
  ASSERT_EQ(stat(saved.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  std::vector<std::string> as_nobody = WithoutThisEnvironment(/*as_nobody=*/true);
  as_nobody.insert(as_nobody.end(),
                   {Built(ZEROCTL_PATH), "--endpoint", zerod.unix_endpoint(), "end", "mine"});
  ProcessResult nobody = RunProcess(as_nobody);
  EXPECT_EQ(nobody.exit_code, 1);
  EXPECT_THAT(nobody.err, HasSubstr("job mine: no credentials"));
  ProcessResult ended =
      RunProcess({Built(ZEROCTL_PATH), "--endpoint", zerod.unix_endpoint(), "end", "mine"});
  EXPECT_EQ(ended.exit_code, 0) << ended.err;
  EXPECT_EQ(ended.out, "job mine ended\n");
  EXPECT_FALSE(owner->StoreGet("mine", "k", absl::ZeroDuration()).ok());

  // Someone else's job, whose token this user does not have: only the admin token ends it.
  auto other = zerod.ClientWithToken(client::NewToken());
  ASSERT_TRUE(other->Join(OneRankJob("theirs"), Scaled(absl::Seconds(30))).ok());
  std::vector<std::string> as_me = WithoutThisEnvironment(/*as_nobody=*/false);
  as_me.insert(as_me.end(),
               {Built(ZEROCTL_PATH), "--endpoint", zerod.unix_endpoint(), "end", "theirs"});
  ProcessResult denied = RunProcess(as_me);
  EXPECT_EQ(denied.exit_code, 1);
  EXPECT_THAT(denied.err, HasSubstr("job theirs: no credentials"));
  ProcessResult admin = RunProcess({Built(ZEROCTL_PATH), "--endpoint", zerod.unix_endpoint(), "end",
                                    "theirs", "--admin-token-file", zerod.admin_token_file()});
  EXPECT_EQ(admin.exit_code, 0) << admin.err;
  auto job = other->DescribeJob("theirs");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->summary().state(), v1::JOB_ENDED);

  ProcessResult missing =
      RunProcess({Built(ZEROCTL_PATH), "--endpoint", zerod.unix_endpoint(), "end", "theirs",
                  "--admin-token-file", zerod.dir().path() + "/none"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("--admin-token-file: no token file"));
}

TEST(Auth, ZerorunGivesItsRanksTheJobTokenWithoutTheUserWritingOne) {
  AuthDaemon zerod;
  ASSERT_EQ(zerod.Start(), -1) << zerod.Log();
  const ProcessResult run =
      RunProcess({Built(ZERORUN_PATH), "-n", "2", "--endpoint", zerod.unix_endpoint(), "--job",
                  "launched", "--", Built(JOIN_CLIENT_PATH), "--endpoint", zerod.unix_endpoint(),
                  "--job", "launched", "--world", "2", "--set", "addr=here", "--leave"});
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("\"generation\""));
  // The token is kept for the user's later commands, readable by the user alone.
  struct stat st {};
  ASSERT_EQ(stat((zerod.config_dir() + "/jobs/launched.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Someone else starting ranks under the same job id is refused.
  const nlohmann::json r =
      ProbeAsNobody({"--endpoint", zerod.unix_endpoint(), "--job", "launched", "--call", "join"});
  EXPECT_EQ(r.value("code", 0), kUnauthenticated) << r.dump();
}

TEST(Auth, AJobStoredBeforeAuthenticationIsTheAdminsUntilItEnds) {
  AuthDaemon zerod;
  ASSERT_EQ(zerod.Start({"--no-auth"}), -1) << zerod.Log();
  const std::string token = client::NewToken();
  ASSERT_TRUE(
      zerod.ClientWithToken(token)->Join(OneRankJob("old"), Scaled(absl::Seconds(30))).ok());
  ASSERT_TRUE(zerod.ClientWithToken(token)->StoreSet("old", "k", "v").ok());
  ASSERT_EQ(zerod.Stop(), 0);

  ASSERT_EQ(zerod.Start(), -1) << zerod.Log();
  auto holder = zerod.ClientWithToken(token);
  auto refused = holder->StoreGet("old", "k", absl::ZeroDuration());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("job old has no owner token"));
  client::ClientOptions admin_options;
  admin_options.admin_token = *client::ReadTokenFile(zerod.admin_token_file());
  auto admin = zerod.Client(admin_options);
  auto value = admin->StoreGet("old", "k", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  ASSERT_TRUE(admin->EndJob("old").ok());
  // Ended, it is free again: the next join owns it.
  EXPECT_TRUE(holder->Join(OneRankJob("old"), Scaled(absl::Seconds(30))).ok());
  EXPECT_TRUE(holder->StoreSet("old", "k", "mine now").ok());
}

// zeroctl run as nobody with nothing of this process's environment but `env`.
ProcessResult ZeroctlAsNobody(const std::vector<std::string>& env,
                              const std::vector<std::string>& args) {
  std::vector<std::string> argv = WithoutThisEnvironment(/*as_nobody=*/true);
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(Built(ZEROCTL_PATH));
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv);
}

TEST(Auth, OverTcpTheReadOnlyViewsNeedTheViewerTokenTheAdminTokenOrTheJobsOwn) {
  AuthDaemon zerod;
  const std::string viewer_file = zerod.dir().path() + "/viewer.token";
  ASSERT_EQ(zerod.Start({"--viewer-group", "nogroup", "--viewer-token-file", viewer_file}), -1)
      << zerod.Log();
  const std::string token = client::NewToken();
  ASSERT_TRUE(
      zerod.ClientWithToken(token)->Join(OneRankJob("watched"), Scaled(absl::Seconds(30))).ok());
  // The viewer token is readable by its group and nobody else.
  struct stat st {};
  ASSERT_EQ(stat(viewer_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_gid, 65534u);

  // As nobody over TCP without a token: every view is refused, saying what would do.
  const ProcessResult jobs = ZeroctlAsNobody({}, {"--endpoint", zerod.tcp_endpoint(), "jobs"});
  EXPECT_EQ(jobs.exit_code, 1) << jobs.out;
  EXPECT_THAT(jobs.err, HasSubstr("to list jobs: no credentials: over TCP a call needs the viewer "
                                  "token"));
  EXPECT_THAT(jobs.out, Not(HasSubstr("watched")));
  for (const char* command : {"members", "shards", "memory", "watch", "checkpoints"}) {
    SCOPED_TRACE(command);
    const ProcessResult r =
        ZeroctlAsNobody({}, {"--endpoint", zerod.tcp_endpoint(), command, "watched"});
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.err, HasSubstr("job watched: to inspect it: no credentials"));
  }
  for (const std::string& presented : {std::string(), client::NewToken()}) {
    const nlohmann::json r = ProbeAsNobody({"--endpoint", zerod.tcp_endpoint(), "--job", "watched",
                                            "--call", "describe", "--token", presented});
    EXPECT_EQ(r.value("code", 0), presented.empty() ? kUnauthenticated : kPermissionDenied)
        << r.dump();
    EXPECT_THAT(r.value("message", ""), HasSubstr("the viewer token"));
  }
  // With the viewer token (its group may read it): allowed.
  const std::string env = "ZEROD_VIEWER_TOKEN_FILE=" + viewer_file;
  const ProcessResult viewed = ZeroctlAsNobody({env}, {"--endpoint", zerod.tcp_endpoint(), "jobs"});
  EXPECT_EQ(viewed.exit_code, 0) << viewed.err;
  EXPECT_THAT(viewed.out, HasSubstr("watched"));
  const ProcessResult members =
      ZeroctlAsNobody({env}, {"--endpoint", zerod.tcp_endpoint(), "members", "watched"});
  EXPECT_EQ(members.exit_code, 0) << members.err;
  EXPECT_THAT(members.out, HasSubstr("node-a"));
  // The job's own token shows that job, not the list of every job.
  client::ClientOptions own;
  own.endpoint = zerod.tcp_endpoint();
  own.job_token = token;
  EXPECT_TRUE(zerod.Client(own)->DescribeJob("watched").ok());
  EXPECT_EQ(zerod.Client(own)->ListJobs().status().code(), absl::StatusCode::kUnauthenticated);
  // Over the Unix socket, its mode decides (0666 here).
  EXPECT_EQ(
      ProbeAsNobody({"--endpoint", zerod.unix_endpoint(), "--job", "watched", "--call", "describe"})
          .value("code", -1),
      0);
  ASSERT_EQ(zerod.Stop(), 0);

  // --open-inspection: whoever may connect may look.
  ASSERT_EQ(zerod.Start({"--open-inspection"}), -1) << zerod.Log();
  const ProcessResult open = ZeroctlAsNobody({}, {"--endpoint", zerod.tcp_endpoint(), "jobs"});
  EXPECT_EQ(open.exit_code, 0) << open.err;
  EXPECT_THAT(open.out, HasSubstr("watched"));
}

TEST(Auth, TheSocketsModeAndGroupDecideWhoMayConnect) {
  AuthDaemon zerod;
  ASSERT_EQ(zerod.Start({}, "127.0.0.1:0", "0660"), -1) << zerod.Log();
  struct stat st {};
  ASSERT_EQ(stat(zerod.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, getegid());
  // nobody is not in the socket's group: it cannot connect at all.
  const nlohmann::json refused =
      ProbeAsNobody({"--endpoint", zerod.unix_endpoint(), "--job", "j", "--call", "describe"});
  EXPECT_EQ(refused.value("code", 0), 14) << refused.dump();  // UNAVAILABLE
  ASSERT_EQ(zerod.Stop(), 0);

  // The socket given to nobody's group: it connects (and finds no such job).
  ASSERT_EQ(zerod.Start({"--socket-group", "nogroup"}, "127.0.0.1:0", "0660"), -1) << zerod.Log();
  ASSERT_EQ(stat(zerod.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 65534u);
  const nlohmann::json connected =
      ProbeAsNobody({"--endpoint", zerod.unix_endpoint(), "--job", "j", "--call", "describe"});
  EXPECT_EQ(connected.value("code", 0), 5) << connected.dump();  // NOT_FOUND
}

// A CA, a server certificate for 127.0.0.1 and a client certificate, made with the openssl CLI.
void MakeCertificates(const std::string& dir) {
  const std::string script = absl::StrCat(
      "set -e; cd ", dir, "; ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';",
      "openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=zerod-test-ca;",
      "openssl req $ec -keyout server.key -out server.csr -subj /CN=localhost;",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > server.ext;",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2",
      " -extfile server.ext -out server.pem;",
      "openssl req $ec -keyout client.key -out client.csr -subj /CN=trainer;",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2",
      " -out client.pem");
  const ProcessResult r = RunProcess({"/bin/sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(Auth, ATcpListenerOffLoopbackWithoutTlsRefusesToStart) {
  AuthDaemon zerod;
  EXPECT_EQ(zerod.Start({}, "0.0.0.0:0"), 2);
  EXPECT_THAT(zerod.Log(), HasSubstr("zerod: --listen 0.0.0.0:0 is not a loopback address: give "
                                     "--tls-cert and --tls-key, or --allow-plaintext-tcp"));
  EXPECT_EQ(zerod.Start({"--tls-cert", zerod.dir().path() + "/only-a-cert.pem"}, "0.0.0.0:0"), 2);
  EXPECT_THAT(zerod.Log(), HasSubstr("--tls-cert and --tls-key go together"));
  // Said explicitly, it starts.
  ASSERT_EQ(zerod.Start({"--allow-plaintext-tcp"}, "0.0.0.0:0"), -1) << zerod.Log();
  EXPECT_TRUE(zerod
                  .Client({.endpoint = zerod.tcp_endpoint(),
                           .admin_token = *client::ReadTokenFile(zerod.admin_token_file())})
                  ->ListJobs()
                  .ok());
}

TEST(Auth, ATlsListenerServesClientsThatTrustItsCaAndRefusesPlaintext) {
  AuthDaemon zerod;
  const std::string d = zerod.dir().path();
  MakeCertificates(d);
  ASSERT_EQ(zerod.Start({"--tls-cert", d + "/server.pem", "--tls-key", d + "/server.key"}), -1)
      << zerod.Log();
  client::ClientOptions tls;
  tls.endpoint = zerod.tcp_endpoint();
  tls.tls_ca_file = d + "/ca.pem";
  tls.job_token = client::NewToken();
  auto trusted = zerod.Client(tls);
  ASSERT_TRUE(trusted->Join(OneRankJob("over-tls"), Scaled(absl::Seconds(30))).ok());
  EXPECT_TRUE(trusted->StoreSet("over-tls", "k", "v").ok());

  client::ClientOptions plain;
  plain.endpoint = zerod.tcp_endpoint();
  plain.retry_for = absl::Seconds(1);
  auto plaintext = client::CoordinatorClient::Connect(plain);
  ASSERT_TRUE(plaintext.ok());
  const absl::Status refused = (*plaintext)->ListJobs().status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  // "Socket closed" alone does not say why: the message names TLS and what to set.
  EXPECT_THAT(refused.message(), HasSubstr("uses TLS closes a plaintext client's connection: set "
                                           "ZEROD_TLS_CA"));
  ASSERT_EQ(zerod.Stop(), 0);

  // Client certificates required: the CA alone is not enough.
  ASSERT_EQ(zerod.Start({"--tls-cert", d + "/server.pem", "--tls-key", d + "/server.key",
                         "--tls-client-ca", d + "/ca.pem"}),
            -1)
      << zerod.Log();
  tls.endpoint = zerod.tcp_endpoint();
  tls.retry_for = absl::Seconds(1);
  auto anonymous = client::CoordinatorClient::Connect(tls);
  ASSERT_TRUE(anonymous.ok());
  EXPECT_FALSE((*anonymous)->ListJobs().ok());
  tls.tls_cert_file = d + "/client.pem";
  tls.tls_key_file = d + "/client.key";
  auto identified = zerod.Client(tls);
  EXPECT_TRUE(identified->DescribeJob("over-tls").ok());
  auto value = identified->StoreGet("over-tls", "k", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

}  // namespace
}  // namespace zerod::testing
