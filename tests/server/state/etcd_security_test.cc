// zerod's etcd security against real etcds (tests/util/etcd_cluster): the TLS files, the check of
// zerod's own access, the check that etcd keeps zerod's user to its keys (which holds only with
// etcd's authentication on), the names and CA a member's certificate must have, and the store
// over TLS with authentication on (docs/operators.md "zerod on etcd"). A fake etcd, for failure
// injection only, gives the answers that say nothing about authentication.

#include "server/state/etcd_security.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/etcd_claim.h"
#include "server/state/etcd_kv_store.h"
#include "tests/util/certificates.h"
#include "tests/util/etcd_cluster.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;
using zerod::testing::EtcdCluster;
using zerod::testing::EtcdSecurity;

// zerod's options for `etcd` on `prefix`, with its TLS files when it speaks TLS (zerod's user's
// certificate, or `user`'s: root, zerod).
EtcdOptions Options(const EtcdCluster& etcd, const std::string& prefix = "/zerod/",
                    const std::string& user = "zerod") {
  EtcdOptions options;
  options.endpoints = etcd.Endpoints();
  options.prefix = prefix;
  if (!etcd.ZerodFlags().empty()) {
    const std::string d = etcd.dir();
    auto tls = LoadEtcdTls({etcd.ca_file(), d + "/" + user + ".pem", d + "/" + user + ".key"});
    EXPECT_TRUE(tls.ok()) << tls.status();
    if (tls.ok()) options.tls = *std::move(tls);
  }
  return options;
}

class EtcdSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdCluster::Installed(/*with_etcdctl=*/true)) {
      GTEST_SKIP() << "needs /usr/bin/etcd and /usr/bin/etcdctl (scripts/setup.sh)";
    }
  }
};

TEST_F(EtcdSecurityTest, TheTlsFilesGoTogetherAndTheKeyMustBeZerodsAlone) {
  EtcdCluster etcd(1, EtcdSecurity{.tls = true});
  ASSERT_EQ(etcd.error(), "");
  const std::string d = etcd.dir();
  EXPECT_TRUE(LoadEtcdTls({}).ok());
  EXPECT_FALSE(LoadEtcdTls({}).value().enabled());
  auto refused = [](const EtcdTlsFiles& files) {
    auto tls = LoadEtcdTls(files);
    EXPECT_FALSE(tls.ok());
    return std::string(tls.status().message());
  };
  EXPECT_THAT(refused({etcd.ca_file(), d + "/zerod.pem", ""}),
              HasSubstr("--etcd-cert and --etcd-key go together"));
  EXPECT_THAT(refused({"", d + "/zerod.pem", d + "/zerod.key"}),
              HasSubstr("--etcd-ca: needed with --etcd-cert"));
  EXPECT_THAT(refused({d + "/absent.pem", "", ""}), HasSubstr("--etcd-ca: " + d + "/absent.pem"));
  // A key for a certificate is no certificate: etcd would take no user from it.
  EXPECT_THAT(refused({etcd.ca_file(), d + "/zerod.key", d + "/zerod.key"}),
              HasSubstr("--etcd-cert: " + d + "/zerod.key: no certificate with a CN"));
  ASSERT_EQ(chmod((d + "/zerod.key").c_str(), 0644), 0);
  EXPECT_THAT(refused({etcd.ca_file(), d + "/zerod.pem", d + "/zerod.key"}),
              HasSubstr("--etcd-key: " + d + "/zerod.key: mode 0644 lets others read it"));
  ASSERT_EQ(chmod((d + "/zerod.key").c_str(), 0600), 0);
  auto loaded = LoadEtcdTls({etcd.ca_file(), d + "/zerod.pem", d + "/zerod.key"});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->enabled());
  EXPECT_THAT(loaded->cert_pem, HasSubstr("BEGIN CERTIFICATE"));
}

// What zerod refuses, and why: every etcd below lets zerod at its keys, and none keeps it there.
void ExpectRefused(const EtcdOptions& options, EtcdConfinement verdict, const std::string& says) {
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
  const EtcdConfinementCheck check = CheckEtcdConfinement(options);
  EXPECT_EQ(check.verdict, verdict) << check.message;
  EXPECT_THAT(check.message, HasSubstr(says));
  const absl::Status refused = CheckEtcdIsZerods(options, absl::Seconds(30), false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--store: " + check.message));
  EXPECT_THAT(refused.message(), HasSubstr("give --allow-insecure-etcd to run on it anyway"));
  EXPECT_TRUE(CheckEtcdIsZerods(options, absl::Seconds(30), /*allow_insecure=*/true).ok());
}

TEST_F(EtcdSecurityTest, AnEtcdWithAuthenticationOffIsRefusedHoweverItsTransportIsSecured) {
  // Plaintext, as the recipe once ran it; TLS that takes clients without certificates; and TLS
  // with client certificates required but `etcdctl auth enable` never run, where anyone holding
  // any certificate of etcd's CA (another zerod cluster's) may do anything.
  for (const EtcdSecurity& security :
       {EtcdSecurity{}, EtcdSecurity{.tls = true, .client_certs = false},
        EtcdSecurity{.tls = true, .client_certs = true, .auth = false}}) {
    SCOPED_TRACE(
        absl::StrCat("tls ", security.tls, ", client certificates ", security.client_certs));
    EtcdCluster etcd(1, security);
    ASSERT_EQ(etcd.error(), "");
    ExpectRefused(Options(etcd), EtcdConfinement::kAuthenticationOff,
                  absl::StrCat("etcd at ", etcd.Endpoint(0), " has authentication off"));
  }
}

TEST_F(EtcdSecurityTest, ASecuredEtcdLetsZerodAtItsKeysOnlyAndNobodyElseIn) {
  EtcdCluster etcd(3, EtcdSecurity{.tls = true, .auth = true, .zerod_prefix = "/zerod/"});
  ASSERT_EQ(etcd.error(), "");
  const EtcdOptions options = Options(etcd);
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
  EXPECT_EQ(CheckEtcdConfinement(options).verdict, EtcdConfinement::kConfined);
  EXPECT_TRUE(CheckEtcdIsZerods(options, absl::Seconds(30), false).ok());
  // Another prefix is not zerod's role's: refused, naming the user and what to grant.
  const absl::Status other = CheckEtcdAccess(Options(etcd, "/other/"));
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_THAT(other.message(), HasSubstr("--etcd-cert: etcd at "));
  EXPECT_THAT(other.message(), HasSubstr("refused zerod's user 'zerod' (the CN of --etcd-cert)"));
  EXPECT_THAT(other.message(), HasSubstr("etcd needs a user 'zerod' (etcdctl user add zerod "
                                         "--no-password) whose role may read and write /other/ "
                                         "(prefix), /other.claim, /other.commit/ (prefix)"));
  // Without a certificate zerod is no one: its own access fails, saying so.
  EtcdOptions anonymous = options;
  anonymous.tls.cert_pem.clear();
  anonymous.tls.key_pem.clear();
  EXPECT_FALSE(CheckEtcdAccess(anonymous).ok());
  // A member down changes nothing: authentication is the whole cluster's, in its raft log.
  etcd.Kill(2);
  EXPECT_TRUE(CheckEtcdIsZerods(options, absl::Seconds(30), false).ok());

  // The store works there as on a plaintext etcd, its commit marker where the role allows it.
  auto kv = EtcdKvStore::Open(options);
  ASSERT_TRUE(kv.ok()) << kv.status();
  ASSERT_TRUE((*kv)->CommitSync({KvOp::Put("a", "1")}).ok());
  EXPECT_EQ((*kv)->Get("a")->value, "1");
  const zerod::testing::ProcessResult markers =
      etcd.Etcdctl({"get", "--prefix", CommitMarkerPrefix("/zerod/"), "--keys-only"});
  EXPECT_THAT(markers.out, HasSubstr("/zerod.commit/")) << markers.err;
  auto claim = EtcdClaim::TryAcquire(options, EtcdClaimOptions{absl::Seconds(5), "me"}, [] {});
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_NE(claim->claim, nullptr);
}

TEST_F(EtcdSecurityTest, AUserWhoseRolesReachBeyondZerodsKeysIsRefused) {
  EtcdCluster etcd(1, EtcdSecurity{.tls = true, .auth = true, .zerod_prefix = "/zerod/"});
  ASSERT_EQ(etcd.error(), "");
  // etcd's root as zerod's user: authentication is on, and proves nothing about zerod's keys.
  ExpectRefused(Options(etcd, "/zerod/", "root"), EtcdConfinement::kRoleTooBroad,
                "let zerod's user 'root' (the CN of --etcd-cert) read and write "
                "/zerod.outside-probe, outside its keys");
  // A user etcd does not know: named, with the command that makes it.
  ASSERT_EQ(zerod::testing::IssueCertificate(etcd.dir(), "etcd-ca", "stranger", "stranger"), "");
  const absl::Status stranger = CheckEtcdAccess(Options(etcd, "/zerod/", "stranger"));
  EXPECT_THAT(stranger.message(), HasSubstr("refused zerod's user 'stranger'"));
  EXPECT_THAT(stranger.message(), HasSubstr("etcdctl user add stranger --no-password"));
}

TEST_F(EtcdSecurityTest, AMemberIsBelievedOnlyWithACertificateOfEtcdsCaNamingItsEndpoint) {
  // A certificate from a CA zerod was not given; one of the right CA naming another host; the
  // right one, for the same etcd reached as "localhost" (a DNS SAN) and as 127.0.0.1 (an IP SAN).
  EtcdCluster rogue(1, EtcdSecurity{.tls = true, .rogue_member_ca = true});
  ASSERT_EQ(rogue.error(), "");
  EtcdCluster misnamed(1, EtcdSecurity{.tls = true, .member_sans = "DNS:elsewhere.example"});
  ASSERT_EQ(misnamed.error(), "");
  EtcdOptions options = Options(rogue);
  options.request_timeout = absl::Seconds(3);
  const absl::Status untrusted = CheckEtcdAccess(options);
  EXPECT_EQ(untrusted.code(), absl::StatusCode::kUnavailable) << untrusted;
  EXPECT_THAT(untrusted.message(),
              HasSubstr("certificate verify failed (a member's certificate is not signed by the "
                        "CA of --etcd-ca)"));
  options = Options(misnamed);
  options.request_timeout = absl::Seconds(3);
  const absl::Status wrong_name = CheckEtcdAccess(options);
  EXPECT_EQ(wrong_name.code(), absl::StatusCode::kUnavailable) << wrong_name;
  EXPECT_THAT(wrong_name.message(),
              HasSubstr("a member's certificate names none of the endpoints (127.0.0.1) among its "
                        "subject alternative names"));

  EtcdCluster etcd(1, EtcdSecurity{.tls = true});
  ASSERT_EQ(etcd.error(), "");
  options = Options(etcd);
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
  options.endpoints = {"localhost:" + etcd.Endpoint(0).substr(etcd.Endpoint(0).rfind(':') + 1)};
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
}

// A FAKE for failure injection: an etcd KV service that answers every request on zerod's keys and
// fails those on the key outside them with `outside`.
class FakeEtcdForFailures final : public etcdserverpb::KV::Service {
 public:
  explicit FakeEtcdForFailures(grpc::Status outside) : outside_(std::move(outside)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeEtcdForFailures() override { server_->Shutdown(); }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status Range(grpc::ServerContext*, const etcdserverpb::RangeRequest* request,
                     etcdserverpb::RangeResponse*) override {
    return Outside(request->key()) ? outside_ : grpc::Status::OK;
  }
  grpc::Status Txn(grpc::ServerContext*, const etcdserverpb::TxnRequest* request,
                   etcdserverpb::TxnResponse*) override {
    for (const etcdserverpb::RequestOp& op : request->success()) {
      if (op.has_request_put() && Outside(op.request_put().key())) return outside_;
    }
    return grpc::Status::OK;
  }

 private:
  static bool Outside(const std::string& key) { return key == EtcdOutsideKeyOf("/zerod/"); }
  const grpc::Status outside_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(EtcdConfinement, OnlyAPermissionRefusalCountsAsConfinedAndAnUnknownIsRefused) {
  FakeEtcdForFailures refuses(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "denied"));
  EtcdOptions options;
  options.endpoints = {refuses.endpoint()};
  options.request_timeout = absl::Seconds(3);
  EXPECT_EQ(CheckEtcdConfinement(options).verdict, EtcdConfinement::kConfined);
  EXPECT_TRUE(CheckEtcdIsZerods(options, absl::Seconds(5), false).ok());
  // An error that says nothing of permissions (a member failing, not answering) proves nothing.
  for (const grpc::StatusCode code : {grpc::StatusCode::INTERNAL, grpc::StatusCode::UNAVAILABLE,
                                      grpc::StatusCode::DEADLINE_EXCEEDED}) {
    SCOPED_TRACE(code);
    FakeEtcdForFailures failing(grpc::Status(code, "injected failure"));
    options.endpoints = {failing.endpoint()};
    const EtcdConfinementCheck check = CheckEtcdConfinement(options);
    EXPECT_EQ(check.verdict, EtcdConfinement::kUnknown);
    EXPECT_THAT(check.message, HasSubstr("injected failure"));
    const absl::Status refused = CheckEtcdIsZerods(options, absl::Seconds(1), false);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(refused.message(),
                HasSubstr("--store: cannot tell whether etcd keeps zerod's user to its keys"));
    EXPECT_TRUE(CheckEtcdIsZerods(options, absl::Seconds(1), /*allow_insecure=*/true).ok());
  }
}

}  // namespace
}  // namespace zerod::server
