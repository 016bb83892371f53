// A zerod cluster on etcd trusts only its members (issue 31's first case). Against a real 3-member
// etcd and three zerods secured as docs/operators.md says (zerod_cluster.h), another Unix user
// (runuser nobody) and outsiders holding the wrong certificate try each way in the issue found:
// read what the cluster keeps in etcd, write a job's owner record there, pass for a member with a
// forwarded call, end another's job after a failover. Each fails; beside each, the holder of the
// right credential does the same thing, so a refusal for another reason would not pass. A follower
// sends nothing to a "leader" whose certificate is not of the cluster's CA. And a zerod given an
// etcd with authentication off, or credentials others may read, refuses to start.

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/auth_metadata.h"
#include "runtime/common/mutex.h"
#include "tests/integration/other_user.h"
#include "tests/integration/zerod_cluster.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/certificates.h"
#include "tests/util/etcd_cluster.h"
#include "tests/util/test_time.h"
#include "zerod/v1/coordinator.grpc.pb.h"
#include "zerod/v1/inspect.grpc.pb.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kUnreadable = -1;  // cluster_probe: a file given could not be read
constexpr int kOk = 0;
constexpr int kUnavailable = 14;
constexpr int kUnauthenticated = 16;
constexpr int kPermissionDenied = 7;

// What a forger adds to pass for a member's forwarded call: "came through my socket", a node
// address to hand out, and a cluster secret (what the leader once believed).
const std::vector<std::string> kForgedHeaders = {"--header", "zerod-forwarded-via=unix",
                                                 "--header", "zerod-node-address=10.66.6.6",
                                                 "--header", "zerod-cluster-secret=guessed"};

// Runs tests/integration/cluster_probe with `args`, as nobody or as this user; its JSON line.
json Probe(bool as_nobody, const std::vector<std::string>& args) {
  return RunProbe(as_nobody, Built(CLUSTER_PROBE_PATH), args);
}

std::vector<std::string> Plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::unique_ptr<client::CoordinatorClient> ClientOf(const std::string& endpoint,
                                                    const std::string& token) {
  client::ClientOptions options;
  options.endpoint = endpoint;
  options.job_token = token;
  options.retry_for = Scaled(absl::Seconds(60));
  options.call_timeout = Scaled(absl::Seconds(10));
  return *client::CoordinatorClient::Connect(options);
}

class ClusterSecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdCluster::Installed(/*with_etcdctl=*/true)) {
      GTEST_SKIP() << "needs /usr/bin/etcd and /usr/bin/etcdctl (scripts/setup.sh)";
    }
    if (geteuid() != 0) GTEST_SKIP() << "needs root, to run probes as the user nobody";
    etcd_ = std::make_unique<EtcdCluster>(
        3, EtcdSecurity{.tls = true, .auth = true, .zerod_prefix = "/zerod-test/"});
    ASSERT_EQ(etcd_->error(), "");
  }

  // The cluster, its directories opened for nobody to reach the public CA certificates (a CA
  // certificate is no secret); every key stays 0600.
  void StartCluster(absl::Duration lease_ttl = absl::Seconds(10),
                    const std::vector<std::string>& extra_flags = {}) {
    cluster_ =
        std::make_unique<ZerodCluster>(*etcd_, lease_ttl, files_, absl::Seconds(3), extra_flags);
    ASSERT_NO_FATAL_FAILURE(cluster_->Start());
    for (const std::string& dir : {etcd_->dir(), files_.path(), cluster_->pki()}) {
      ASSERT_EQ(chmod(dir.c_str(), 0711), 0) << dir;
    }
  }

  // The owner (this user) makes a job of one rank through node 1's socket (a follower's).
  void MakeVictim() {
    auto owner = ClientOf(cluster_->daemon(1).endpoint(), owner_token_);
    auto joined = owner->Join(OneRankJob("victim", "node-b"), Scaled(absl::Seconds(60)));
    ASSERT_TRUE(joined.ok()) << joined.status();
  }

  // etcd's value of `key` as its root user reads it.
  std::string EtcdValue(const std::string& key) {
    const ProcessResult r = etcd_->Etcdctl({"get", key, "--print-value-only"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  TempDir files_;
  std::unique_ptr<ZerodCluster> cluster_;
  const std::string owner_token_ = client::NewToken();
  const std::string nobody_token_ = client::NewToken();
};

TEST_F(ClusterSecurity, NobodyCanNeitherReadNorWriteWhatTheClusterKeepsInEtcd) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(MakeVictim());
  const std::string record = "/zerod-test/auth/jobs/victim";
  const std::string owner_digest = EtcdValue(record);
  ASSERT_FALSE(owner_digest.empty());
  const std::string d = etcd_->dir();
  // A certificate nobody holds the key of: its own, of a CA of its own, that calls itself root.
  const std::string own = files_.path() + "/nobody";
  ASSERT_EQ(mkdir(own.c_str(), 0700), 0);
  ASSERT_EQ(MakeCa(own, "nobody-ca"), "");
  ASSERT_EQ(IssueCertificate(own, "nobody-ca", "root", "root"), "");
  for (const std::string& file : {own, own + "/root.pem", own + "/root.key"}) {
    ASSERT_EQ(chown(file.c_str(), 65534, 65534), 0) << file;
  }
  // What nobody may hold or try, and how each ends: nothing (plaintext to a TLS port), or the
  // public CA alone (no client certificate), or its own certificate (another CA): etcd drops the
  // connection before any call ("failed to connect", never refused: the endpoint is there); and
  // zerod's or root's certificate, which it can read but whose keys it cannot.
  struct Attempt {
    std::vector<std::string> presented;
    int code;
    std::string says;
  };
  const std::vector<Attempt> attempts = {
      {{}, kUnavailable, "failed to connect to all addresses"},
      {{"--ca", etcd_->ca_file()}, kUnavailable, "failed to connect to all addresses"},
      {{"--ca", etcd_->ca_file(), "--cert", own + "/root.pem", "--key", own + "/root.key"},
       kUnavailable,
       "failed to connect to all addresses"},
      {{"--ca", etcd_->ca_file(), "--cert", d + "/zerod.pem", "--key", d + "/zerod.key"},
       kUnreadable,
       "cannot read " + d + "/zerod.key: Permission denied"},
      {{"--ca", etcd_->ca_file(), "--cert", d + "/root.pem", "--key", d + "/root.key"},
       kUnreadable,
       "cannot read " + d + "/root.key: Permission denied"}};
  for (const std::string& endpoint : etcd_->Endpoints()) {
    for (const Attempt& attempt : attempts) {
      for (const char* call : {"etcd-get", "etcd-put"}) {
        SCOPED_TRACE(
            absl::StrCat(endpoint, " ", call, " with ", absl::StrJoin(attempt.presented, " ")));
        const json r = Probe(true, Plus({"--endpoint", endpoint, "--call", call, "--etcd-key",
                                         record, "--value", "planted"},
                                        attempt.presented));
        EXPECT_EQ(r.value("code", 0), attempt.code) << r.dump();
        EXPECT_THAT(r.value("message", ""), HasSubstr(attempt.says)) << r.dump();
        EXPECT_THAT(r.value("message", ""), Not(HasSubstr("Connection refused"))) << r.dump();
        EXPECT_EQ(r.value("found", 0), 0) << r.dump();
      }
    }
    // The same endpoint answers root's certificate, as root: the refusals were the credentials'.
    const json as_root =
        Probe(false, {"--endpoint", endpoint, "--call", "etcd-get", "--etcd-key", record, "--ca",
                      etcd_->ca_file(), "--cert", d + "/root.pem", "--key", d + "/root.key"});
    EXPECT_EQ(as_root.value("code", -1), kOk) << as_root.dump();
    EXPECT_EQ(as_root.value("found", 0), 1) << as_root.dump();
    // etcd's HTTP API, which the issue's reader used: TLS turns away a client without a
    // certificate once the handshake ends (curl: 35 in it, 55 or 56 sending or reading after it),
    // and the port speaks no plaintext (52: an empty reply). With root's certificate, as root, the
    // same request gets through TLS and etcd answers it, though not with the record: its gateway
    // takes no user from a certificate, so over HTTP nothing is read without a password.
    const std::vector<std::string> range = {
        "/usr/bin/curl",
        "-s",
        "--max-time",
        "10",
        "--cacert",
        etcd_->ca_file(),
        "-d",
        R"({"key": "L3plcm9kLXRlc3QvYXV0aC9qb2JzL3ZpY3RpbQ=="})"};
    for (const std::string& url : {"https://" + endpoint, "http://" + endpoint}) {
      const ProcessResult curl = RunProcess(
          Plus(Plus({"/usr/sbin/runuser", "-u", "nobody", "--"}, range), {url + "/v3/kv/range"}));
      const ::testing::Matcher<int> refused =
          url[4] == 's' ? ::testing::Matcher<int>(::testing::AnyOf(35, 55, 56))
                        : ::testing::Matcher<int>(52);
      EXPECT_THAT(curl.exit_code, refused) << url << ": " << curl.out;
      EXPECT_THAT(curl.out, Not(HasSubstr("kvs"))) << url;
    }
    const ProcessResult root_curl =
        RunProcess(Plus(range, {"--cert", d + "/root.pem", "--key", d + "/root.key",
                                "https://" + endpoint + "/v3/kv/range"}));
    EXPECT_EQ(root_curl.exit_code, 0) << root_curl.err;
    EXPECT_THAT(root_curl.out, HasSubstr("CommonName of client sending a request against gateway "
                                         "will be ignored"));
  }
  // The same probe with root's certificate, as root: it reads the record (so the refusals above
  // were the credentials'), and the record is the owner's still.
  const json as_root =
      Probe(false, {"--endpoint", etcd_->Endpoint(0), "--call", "etcd-get", "--etcd-key", record,
                    "--ca", etcd_->ca_file(), "--cert", d + "/root.pem", "--key", d + "/root.key"});
  EXPECT_EQ(as_root.value("code", -1), kOk) << as_root.dump();
  EXPECT_EQ(as_root.value("value", "") + "\n", owner_digest);
  // No secret beside the prefix for anyone to steal: members know one another by certificates.
  const ProcessResult beside = etcd_->Etcdctl({"get", "--prefix", "/zerod-test.", "--keys-only"});
  EXPECT_THAT(beside.out, HasSubstr("/zerod-test.claim"));
  EXPECT_THAT(beside.out, Not(HasSubstr("secret"))) << beside.out;
}

TEST_F(ClusterSecurity, AForwardedCallIsBelievedOnlyFromAMembersCertificateNeverFromHeaders) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(MakeVictim());
  const std::vector<std::string> ca = {"--ca", cluster_->cluster_ca()};
  for (const int node : {0, 1}) {  // the leader's port, and a follower's (which relays)
    SCOPED_TRACE(absl::StrCat("node ", node));
    const std::vector<std::string> at = {"--endpoint", cluster_->tcp_endpoint(node)};
    // As nobody, over TLS with the public CA and no certificate: the forged headers are a TCP
    // caller's words, and a TCP caller needs a token.
    const json listed =
        Probe(true, Plus(Plus(Plus(at, ca), kForgedHeaders), {"--call", "list-jobs"}));
    EXPECT_EQ(listed.value("code", 0), kUnauthenticated) << listed.dump();
    EXPECT_THAT(listed.value("message", ""), HasSubstr("no credentials: over TCP"));
    const json beat = Probe(
        true, Plus(Plus(Plus(at, ca), kForgedHeaders),
                   {"--call", "node-heartbeat", "--job", "victim", "--token", nobody_token_}));
    EXPECT_EQ(beat.value("code", 0), kPermissionDenied) << beat.dump();
    EXPECT_THAT(beat.value("message", ""), HasSubstr("members"));
    // nobody's own job forms, but the address it forged is not handed back.
    const json joined = Probe(true, Plus(Plus(Plus(at, ca), kForgedHeaders),
                                         {"--call", "join", "--job", absl::StrCat("mine-", node),
                                          "--token", nobody_token_}));
    EXPECT_EQ(joined.value("code", -1), kOk) << joined.dump();
    EXPECT_EQ(joined.value("node_address", "?"), "") << joined.dump();
    const json ended =
        Probe(true, Plus(Plus(Plus(at, ca), kForgedHeaders),
                         {"--call", "end", "--job", "victim", "--token", nobody_token_}));
    EXPECT_EQ(ended.value("code", 0), kPermissionDenied) << ended.dump();
    // Plaintext to a TLS port gets nowhere.
    const json plain = Probe(true, Plus(Plus(at, kForgedHeaders), {"--call", "list-jobs"}));
    EXPECT_EQ(plain.value("code", 0), kUnavailable) << plain.dump();
  }
  // An outsider with a certificate of another CA, named as a member's is: no handshake.
  const std::string rogue = files_.path() + "/rogue";
  ASSERT_EQ(mkdir(rogue.c_str(), 0700), 0);
  ASSERT_EQ(MakeCa(rogue, "rogue-ca"), "");
  ASSERT_EQ(IssueCertificate(rogue, "rogue-ca", "member", "zerod-member",
                             "IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost"),
            "");
  const std::vector<std::string> leader = {"--endpoint", cluster_->tcp_endpoint(0)};
  const json outsider =
      Probe(false, Plus(Plus(leader, {"--ca", cluster_->cluster_ca(), "--cert",
                                      rogue + "/member.pem", "--key", rogue + "/member.key"}),
                        Plus(kForgedHeaders, {"--call", "list-jobs"})));
  EXPECT_EQ(outsider.value("code", 0), kUnavailable) << outsider.dump();
  // The member's certificate, and only it, makes the same headers believed.
  const std::vector<std::string> member = {"--ca",   cluster_->cluster_ca(),
                                           "--cert", cluster_->member_cert(),
                                           "--key",  cluster_->member_key()};
  const json as_member =
      Probe(false, Plus(Plus(leader, member), Plus(kForgedHeaders, {"--call", "list-jobs"})));
  EXPECT_EQ(as_member.value("code", -1), kOk) << as_member.dump();
  EXPECT_GE(as_member.value("jobs", 0), 1) << as_member.dump();
  const json member_join =
      Probe(false, Plus(Plus(leader, member),
                        Plus(kForgedHeaders,
                             {"--call", "join", "--job", "members-own", "--token", owner_token_})));
  EXPECT_EQ(member_join.value("code", -1), kOk) << member_join.dump();
  EXPECT_EQ(member_join.value("node_address", ""), "10.66.6.6") << member_join.dump();
}

TEST_F(ClusterSecurity, AClientCertificateIsNoMembersEvenWhenTheListenerTrustsItsCa) {
  // Trainers with client certificates of their own CA (--tls-client-ca), as the Kubernetes
  // manifests run them.
  const std::string clients = files_.path() + "/clients";
  ASSERT_EQ(mkdir(clients.c_str(), 0700), 0);
  ASSERT_EQ(MakeCa(clients, "clients-ca"), "");
  ASSERT_EQ(IssueCertificate(clients, "clients-ca", "trainer", "zerod-member"), "");
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(absl::Seconds(10), {"--tls-client-ca", clients + "/clients-ca.pem"}));
  const std::vector<std::string> leader = {"--endpoint", cluster_->tcp_endpoint(0), "--ca",
                                           cluster_->cluster_ca()};
  const std::vector<std::string> trainer = {"--cert", clients + "/trainer.pem", "--key",
                                            clients + "/trainer.key"};
  const json listed =
      Probe(false, Plus(Plus(leader, trainer), Plus(kForgedHeaders, {"--call", "list-jobs"})));
  EXPECT_EQ(listed.value("code", 0), kUnauthenticated) << listed.dump();
  const json beat = Probe(
      false, Plus(Plus(leader, trainer), Plus(kForgedHeaders, {"--call", "node-heartbeat", "--job",
                                                               "any", "--token", nobody_token_})));
  EXPECT_EQ(beat.value("code", 0), kPermissionDenied) << beat.dump();
  // Without a certificate the listener takes no one; with the member's, the headers count.
  const json anonymous = Probe(false, Plus(leader, {"--call", "list-jobs"}));
  EXPECT_EQ(anonymous.value("code", 0), kUnavailable) << anonymous.dump();
  const json as_member =
      Probe(false,
            Plus(Plus(leader, {"--cert", cluster_->member_cert(), "--key", cluster_->member_key()}),
                 Plus(kForgedHeaders, {"--call", "list-jobs"})));
  EXPECT_EQ(as_member.value("code", -1), kOk) << as_member.dump();

  // One CA for both would make every trainer a member: refused.
  ZerodHarness same_ca;
  const ProcessResult refused = same_ca.StartRefused(
      Plus(Plus({"--store", "etcd://" + etcd_->Endpoint(0) + etcd_->zerod_prefix(), "--listen",
                 "127.0.0.1:0", "--tls-cert", cluster_->member_cert(), "--tls-key",
                 cluster_->member_key(), "--cluster-ca", cluster_->cluster_ca(), "--tls-client-ca",
                 cluster_->cluster_ca()},
                etcd_->ZerodFlags()),
           {}));
  EXPECT_EQ(refused.exit_code, 2) << refused.out;
  EXPECT_THAT(refused.out, HasSubstr("--cluster-ca: a certificate of --tls-client-ca is one of its "
                                     "certificates or chains to them"));
}

TEST_F(ClusterSecurity, AfterAFailoverAnotherUsersTokenStillEndsNoJob) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(absl::Seconds(4)));
  ASSERT_NO_FATAL_FAILURE(MakeVictim());
  const std::string record = "/zerod-test/auth/jobs/victim";
  const std::string owner_digest = EtcdValue(record);
  // nobody plants its own token's owner record, with every credential it can lay hands on.
  for (const std::vector<std::string>& presented :
       std::vector<std::vector<std::string>>{{}, {"--ca", etcd_->ca_file()}}) {
    const json planted = Probe(true, Plus({"--endpoint", etcd_->Endpoint(0), "--call", "etcd-put",
                                           "--etcd-key", record, "--value", "planted"},
                                          presented));
    EXPECT_EQ(planted.value("code", 0), kUnavailable) << planted.dump();
  }
  cluster_->daemon(0).Crash();
  ASSERT_TRUE(
      Eventually([&] { return cluster_->Leads(1) || cluster_->Leads(2); }, absl::Seconds(60)))
      << cluster_->Log(1) << cluster_->Log(2);
  const int leader = cluster_->Leads(1) ? 1 : 2;
  EXPECT_THAT(cluster_->Log(leader), HasSubstr("job(s) recovered"));
  EXPECT_EQ(EtcdValue(record), owner_digest);
  for (const int node : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("node ", node, leader == node ? " (the new leader)" : ""));
    // The other follower may still be electing, and then listens on a new port: a refusal for want
    // of a leader would say nothing.
    std::vector<std::string> at;
    json ended;
    ASSERT_TRUE(Eventually(
        [&] {
          at = {"--endpoint", cluster_->tcp_endpoint(node),
                "--ca",       cluster_->cluster_ca(),
                "--call",     "end",
                "--job",      "victim"};
          ended = Probe(true, Plus(at, {"--token", nobody_token_}));
          return ended.value("code", 0) != kUnavailable;
        },
        absl::Seconds(60)))
        << ended.dump();
    EXPECT_EQ(ended.value("code", 0), kPermissionDenied) << ended.dump();
    EXPECT_THAT(ended.value("message", ""), HasSubstr("job victim: the token presented"));
    const json forged = Probe(true, Plus(Plus(at, kForgedHeaders), {"--token", nobody_token_}));
    EXPECT_EQ(forged.value("code", 0), kPermissionDenied) << forged.dump();
  }
  // The job is the owner's still: it is not ended, and the owner's token ends it.
  auto owner = ClientOf(cluster_->daemon(leader).endpoint(), owner_token_);
  auto job = owner->DescribeJob("victim");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_NE(job->summary().state(), v1::JOB_ENDED);
  EXPECT_TRUE(owner->EndJob("victim").ok());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A FAKE for this test only: a "leader" a follower may be pointed at (its address in the claim),
// serving TLS with the certificate it is given and answering ListJobs and EndJob; it keeps the
// job tokens that reach it, which a follower passes on with its callers' calls.
class ImpostorLeader final : public v1::Inspect::Service, public v1::Coordinator::Service {
 public:
  ImpostorLeader(const std::string& cert, const std::string& key) {
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({ReadAll(key), ReadAll(cert)});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(tls), &port_);
    builder.RegisterService(static_cast<v1::Inspect::Service*>(this));
    builder.RegisterService(static_cast<v1::Coordinator::Service*>(this));
    server_ = builder.BuildAndStart();
  }
  ~ImpostorLeader() override { server_->Shutdown(); }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<std::string> tokens() const {
    MutexLock lock(&mu_);
    return tokens_;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status EndJob(grpc::ServerContext* context, const v1::EndJobRequest*,
                      v1::EndJobResponse*) override {
    MutexLock lock(&mu_);
    for (const auto& [key, value] : context->client_metadata()) {
      if (key == rpc::kJobTokenMetadata) tokens_.emplace_back(value.data(), value.size());
    }
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ClusterSecurity, AFollowerSendsNothingToALeaderWhoseCertificateIsNotTheClusters) {
  cluster_ = std::make_unique<ZerodCluster>(*etcd_, absl::Seconds(10), files_);
  ASSERT_EQ(cluster_->error(), "");
  const std::string rogue = files_.path() + "/rogue";
  ASSERT_EQ(mkdir(rogue.c_str(), 0700), 0);
  ASSERT_EQ(MakeCa(rogue, "rogue-ca"), "");
  ASSERT_EQ(IssueCertificate(rogue, "rogue-ca", "leader", "zerod-member",
                             "IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost"),
            "");
  // A member's certificate, which only a member holds; and one just like it from another CA, which
  // whoever can write the claim (or answer on the leader's address) could hold.
  ImpostorLeader member(cluster_->member_cert(), cluster_->member_key());
  ImpostorLeader impostor(rogue + "/leader.pem", rogue + "/leader.key");
  const std::string claim =
      etcd_->zerod_prefix().substr(0, etcd_->zerod_prefix().size() - 1) + ".claim";
  auto point_claim_at = [&](const ImpostorLeader& leader, int node) {
    const ProcessResult put = etcd_->Etcdctl(
        {"put", claim,
         json{{"node", absl::StrCat("node-", node)}, {"endpoint", leader.endpoint()}, {"pid", 1}}
             .dump()});
    ASSERT_EQ(put.exit_code, 0) << put.err;
  };
  ASSERT_NO_FATAL_FAILURE(point_claim_at(member, 8));
  ASSERT_NO_FATAL_FAILURE(cluster_->daemon(0).Start());
  ASSERT_TRUE(Eventually([&] { return cluster_->Follows(0, 8); }, absl::Seconds(30)))
      << cluster_->Log(0);
  // The owner ends its job through the follower's socket: the call, token and all, reaches the
  // member that holds the claim.
  const std::vector<std::string> end = {
      "--endpoint", cluster_->daemon(0).endpoint(), "--call", "end", "--job", "victim", "--token",
      owner_token_};
  const json to_member = Probe(false, end);
  EXPECT_EQ(to_member.value("code", -1), kOk) << to_member.dump();
  EXPECT_EQ(member.tokens(), std::vector<std::string>{owner_token_});

  // The claim now names the impostor: the follower follows it, and its handshake fails.
  ASSERT_NO_FATAL_FAILURE(point_claim_at(impostor, 9));
  ASSERT_TRUE(Eventually([&] { return cluster_->Follows(0, 9); }, absl::Seconds(30)))
      << cluster_->Log(0);
  const json to_impostor = Probe(false, end);
  EXPECT_EQ(to_impostor.value("code", 0), kUnavailable) << to_impostor.dump();
  EXPECT_TRUE(impostor.tokens().empty());
  EXPECT_EQ(member.tokens().size(), 1u);
}

TEST_F(ClusterSecurity, AZerodRefusesAnEtcdWithAuthenticationOffUnlessToldSoExplicitly) {
  TempDir pki;
  ASSERT_EQ(MakeCa(pki.path(), "cluster-ca"), "");
  ASSERT_EQ(IssueCertificate(pki.path(), "cluster-ca", "member", "zerod-member"), "");
  const std::vector<std::string> member = {"--listen",     "127.0.0.1:0",
                                           "--tls-cert",   pki.path() + "/member.pem",
                                           "--tls-key",    pki.path() + "/member.key",
                                           "--cluster-ca", pki.path() + "/cluster-ca.pem"};
  // Plaintext, as the recipe once ran it; TLS that takes clients without certificates; and TLS
  // with client certificates required on every port but `etcdctl auth enable` never run, where
  // any certificate of etcd's CA (another cluster's zerods') opens everything.
  for (const EtcdSecurity& security :
       {EtcdSecurity{}, EtcdSecurity{.tls = true, .client_certs = false},
        EtcdSecurity{.tls = true, .client_certs = true, .auth = false}}) {
    SCOPED_TRACE(
        absl::StrCat("TLS ", security.tls, ", client certificates ", security.client_certs));
    auto etcd = std::make_unique<EtcdCluster>(3, security);
    ASSERT_EQ(etcd->error(), "");
    const std::vector<std::string> flags = Plus(
        Plus({"--store", "etcd://" + absl::StrJoin(etcd->Endpoints(), ",") + "/zerod/"}, member),
        etcd->ZerodFlags());
    ZerodHarness zerod(flags);
    const ProcessResult refused = zerod.StartRefused();
    EXPECT_EQ(refused.exit_code, 2) << refused.out;
    EXPECT_THAT(refused.out,
                HasSubstr(absl::StrCat("--store: etcd at ", absl::StrJoin(etcd->Endpoints(), ","),
                                       " has authentication off")));
    EXPECT_THAT(refused.out, HasSubstr("give --allow-insecure-etcd to run on it anyway"));
    ASSERT_NO_FATAL_FAILURE(zerod.Start({"--allow-insecure-etcd"}));
    EXPECT_THAT(zerod.Log(), HasSubstr("running on it anyway (--allow-insecure-etcd)"));
    EXPECT_TRUE(
        Eventually([&] { return zerod.Log().find("leads the cluster") != std::string::npos; },
                   absl::Seconds(30)))
        << zerod.Log();
  }
}

TEST_F(ClusterSecurity, CredentialsOthersMayReadOrAnEtcdRoleThatDoesNotCoverThePrefixAreRefused) {
  const std::string pki = files_.path();
  ASSERT_EQ(MakeCa(pki, "cluster-ca"), "");
  ASSERT_EQ(IssueCertificate(pki, "cluster-ca", "member", "zerod-member"), "");
  const std::string store = "etcd://" + etcd_->Endpoint(0) + etcd_->zerod_prefix();
  const std::vector<std::string> base = {"--listen", "127.0.0.1:0"};
  const std::vector<std::string> member = {"--tls-cert",   pki + "/member.pem",
                                           "--tls-key",    pki + "/member.key",
                                           "--cluster-ca", pki + "/cluster-ca.pem"};
  ZerodHarness zerod;
  // Members with no certificates at all.
  ProcessResult r = zerod.StartRefused(Plus(Plus({"--store", store}, base), etcd_->ZerodFlags()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("--cluster-ca: the members of an etcd cluster prove to one another"));
  // A member key, or zerod's etcd key, that others may read.
  ASSERT_EQ(chmod((pki + "/member.key").c_str(), 0644), 0);
  r = zerod.StartRefused(Plus(Plus(Plus({"--store", store}, base), member), etcd_->ZerodFlags()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--tls-key: " + pki + "/member.key: mode 0644 lets others read it"));
  ASSERT_EQ(chmod((pki + "/member.key").c_str(), 0600), 0);
  const std::string etcd_key = etcd_->dir() + "/zerod.key";
  ASSERT_EQ(chmod(etcd_key.c_str(), 0640), 0);
  r = zerod.StartRefused(Plus(Plus(Plus({"--store", store}, base), member), etcd_->ZerodFlags()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--etcd-key: " + etcd_key + ": mode 0640 lets others read it"));
  ASSERT_EQ(chmod(etcd_key.c_str(), 0600), 0);
  // A prefix zerod's etcd role does not cover: refused by etcd, saying what to grant.
  r = zerod.StartRefused(
      Plus(Plus(Plus({"--store", "etcd://" + etcd_->Endpoint(0) + "/other/"}, base), member),
           etcd_->ZerodFlags()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--etcd-cert: etcd at " + etcd_->Endpoint(0) +
                               " refused zerod's user 'zerod' (the CN of --etcd-cert) access to "
                               "its keys"));
  EXPECT_THAT(r.out, HasSubstr("whose role may read and write /other/ (prefix), /other.claim, "
                               "/other.commit/ (prefix)"));
  // Everything in place: it starts and leads, and its checks of etcd leave nothing in its log
  // (no handshake etcd turned away: every check is made as zerod's own user).
  ASSERT_NO_FATAL_FAILURE(
      zerod.Start(Plus(Plus(Plus({"--store", store}, base), member), etcd_->ZerodFlags())));
  EXPECT_TRUE(Eventually([&] { return zerod.Log().find("leads the cluster") != std::string::npos; },
                         absl::Seconds(30)))
      << zerod.Log();
  for (const char* noise : {"ssl_transport_security", "TSI_DATA_CORRUPTED", "Handshake failed"}) {
    EXPECT_THAT(zerod.Log(), Not(HasSubstr(noise)));
  }
}

}  // namespace
}  // namespace zerod::testing
