// A zerod cluster on etcd trusts only its members (issue 31's first case). Against a real 3-member
// etcd and three zerods secured as docs/operators.md says (zerod_cluster.h), another Unix user
// (runuser nobody) and outsiders holding the wrong certificate try each way in the issue found:
// read what the cluster keeps in etcd, write a job's owner record there, pass for a member with a
// forwarded call, end another's job after a failover. Each fails; beside each, the holder of the
// right credential does the same thing, so a refusal for another reason would not pass. And a
// zerod given an etcd that lets anyone in, or credentials others may read, refuses to start.

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/other_user.h"
#include "tests/integration/zerod_cluster.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/certificates.h"
#include "tests/util/etcd_cluster.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

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
  options.retry_for = absl::Seconds(60);
  options.call_timeout = absl::Seconds(10);
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
  void StartCluster(const std::string& lease_ttl = "10s",
                    const std::vector<std::string>& extra_flags = {}) {
    cluster_ = std::make_unique<ZerodCluster>(*etcd_, lease_ttl, files_, "3s", extra_flags);
    ASSERT_NO_FATAL_FAILURE(cluster_->Start());
    for (const std::string& dir : {etcd_->dir(), files_.path(), cluster_->pki()}) {
      ASSERT_EQ(chmod(dir.c_str(), 0711), 0) << dir;
    }
  }

  // The owner (this user) makes a job of one rank through node 1's socket (a follower's).
  void MakeVictim() {
    auto owner = ClientOf(cluster_->daemon(1).endpoint(), owner_token_);
    auto joined = owner->Join(OneRankJob("victim", "node-b"), absl::Seconds(60));
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
  // What nobody may hold or try: nothing, the public CA, and the CA with zerod's or root's
  // certificate (whose keys it cannot read).
  const std::vector<std::vector<std::string>> credentials = {
      {},
      {"--ca", etcd_->ca_file()},
      {"--ca", etcd_->ca_file(), "--cert", d + "/zerod.pem", "--key", d + "/zerod.key"},
      {"--ca", etcd_->ca_file(), "--cert", d + "/root.pem", "--key", d + "/root.key"}};
  for (const std::string& endpoint : etcd_->Endpoints()) {
    for (const std::vector<std::string>& presented : credentials) {
      for (const char* call : {"etcd-get", "etcd-put"}) {
        SCOPED_TRACE(absl::StrCat(endpoint, " ", call, " with ", presented.size() / 2, " file(s)"));
        const json r = Probe(true, Plus({"--endpoint", endpoint, "--call", call, "--etcd-key",
                                         record, "--value", "planted"},
                                        presented));
        EXPECT_NE(r.value("code", 0), kOk) << r.dump();
        EXPECT_EQ(r.value("found", 0), 0) << r.dump();
      }
    }
    // etcd's HTTP API, which the issue's reader used: TLS refuses a client without a certificate,
    // and the port speaks no plaintext.
    for (const std::string& url : {"https://" + endpoint, "http://" + endpoint}) {
      const ProcessResult curl =
          RunProcess({"/usr/sbin/runuser", "-u", "nobody", "--", "/usr/bin/curl", "-s",
                      "--max-time", "10", "--cacert", etcd_->ca_file(), url + "/v3/kv/range", "-d",
                      R"({"key": "L3plcm9kLXRlc3QvYXV0aC9qb2JzL3ZpY3RpbQ=="})"});
      EXPECT_NE(curl.exit_code, 0) << url << ": " << curl.out;
      EXPECT_THAT(curl.out, Not(HasSubstr("kvs"))) << url;
    }
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
  ASSERT_NO_FATAL_FAILURE(StartCluster("10s", {"--tls-client-ca", clients + "/clients-ca.pem"}));
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
  EXPECT_THAT(refused.out,
              HasSubstr("--cluster-ca: a certificate in it is also in --tls-client-ca"));
}

TEST_F(ClusterSecurity, AfterAFailoverAnotherUsersTokenStillEndsNoJob) {
  ASSERT_NO_FATAL_FAILURE(StartCluster("4s"));
  ASSERT_NO_FATAL_FAILURE(MakeVictim());
  const std::string record = "/zerod-test/auth/jobs/victim";
  const std::string owner_digest = EtcdValue(record);
  // nobody plants its own token's owner record, with every credential it can lay hands on.
  for (const std::vector<std::string>& presented :
       std::vector<std::vector<std::string>>{{}, {"--ca", etcd_->ca_file()}}) {
    const json planted = Probe(true, Plus({"--endpoint", etcd_->Endpoint(0), "--call", "etcd-put",
                                           "--etcd-key", record, "--value", "planted"},
                                          presented));
    EXPECT_NE(planted.value("code", 0), kOk) << planted.dump();
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
    const std::vector<std::string> at = {"--endpoint", cluster_->tcp_endpoint(node),
                                         "--ca",       cluster_->cluster_ca(),
                                         "--call",     "end",
                                         "--job",      "victim"};
    // The other follower may still be electing: a refusal for want of a leader would say nothing.
    json ended;
    ASSERT_TRUE(Eventually(
        [&] {
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

TEST_F(ClusterSecurity, AZerodRefusesAnEtcdThatLetsAnyoneInUnlessToldSoExplicitly) {
  TempDir pki;
  ASSERT_EQ(MakeCa(pki.path(), "cluster-ca"), "");
  ASSERT_EQ(IssueCertificate(pki.path(), "cluster-ca", "member", "zerod-member"), "");
  const std::vector<std::string> member = {"--listen",     "127.0.0.1:0",
                                           "--tls-cert",   pki.path() + "/member.pem",
                                           "--tls-key",    pki.path() + "/member.key",
                                           "--cluster-ca", pki.path() + "/cluster-ca.pem"};
  // Plaintext, as the recipe once ran it; then TLS that takes clients without certificates.
  EtcdCluster plaintext(1);
  ASSERT_EQ(plaintext.error(), "");
  EtcdCluster no_client_certs(1, EtcdSecurity{.tls = true, .client_certs = false});
  ASSERT_EQ(no_client_certs.error(), "");
  for (EtcdCluster* etcd : {&plaintext, &no_client_certs}) {
    SCOPED_TRACE(etcd == &plaintext ? "plaintext" : "TLS without client certificates");
    const std::vector<std::string> flags = Plus(
        Plus({"--store", "etcd://" + etcd->Endpoint(0) + "/zerod/"}, member), etcd->ZerodFlags());
    ZerodHarness zerod(flags);
    const ProcessResult refused = zerod.StartRefused();
    EXPECT_EQ(refused.exit_code, 2) << refused.out;
    EXPECT_THAT(refused.out, HasSubstr(absl::StrCat("--store: etcd at ", etcd->Endpoint(0),
                                                    " lets in anyone who can reach it")));
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
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("refused zerod's user (the CN of --etcd-cert) access to its keys"));
  EXPECT_THAT(r.out, HasSubstr("grant its role readwrite on /other/ (prefix), /other.claim, "
                               "/other.commit/ (prefix)"));
  // Everything in place: it starts and leads.
  ASSERT_NO_FATAL_FAILURE(
      zerod.Start(Plus(Plus(Plus({"--store", store}, base), member), etcd_->ZerodFlags())));
  EXPECT_TRUE(Eventually([&] { return zerod.Log().find("leads the cluster") != std::string::npos; },
                         absl::Seconds(30)))
      << zerod.Log();
}

}  // namespace
}  // namespace zerod::testing
