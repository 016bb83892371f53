// zerod's etcd security against real etcds (tests/util/etcd_cluster): the TLS files, the check of
// zerod's own access, the search for members that let anyone in, and the store over TLS with
// authentication on (docs/operators.md "zerod on etcd").

#include "server/state/etcd_security.h"

#include <sys/stat.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/state/etcd_claim.h"
#include "server/state/etcd_kv_store.h"
#include "tests/util/etcd_cluster.h"

namespace zerod::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using zerod::testing::EtcdCluster;
using zerod::testing::EtcdSecurity;

constexpr absl::Duration kProbeTimeout = absl::Seconds(3);

// zerod's options for `etcd` on `prefix`, with its TLS files when it speaks TLS.
EtcdOptions Options(const EtcdCluster& etcd, const std::string& prefix = "/zerod/") {
  EtcdOptions options;
  options.endpoints = etcd.Endpoints();
  options.prefix = prefix;
  const std::vector<std::string> flags = etcd.ZerodFlags();
  if (!flags.empty()) {
    auto tls = LoadEtcdTls({flags[1], flags[3], flags[5]});
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
  ASSERT_EQ(chmod((d + "/zerod.key").c_str(), 0644), 0);
  EXPECT_THAT(refused({etcd.ca_file(), d + "/zerod.pem", d + "/zerod.key"}),
              HasSubstr("--etcd-key: " + d + "/zerod.key: mode 0644 lets others read it"));
  ASSERT_EQ(chmod((d + "/zerod.key").c_str(), 0600), 0);
  auto loaded = LoadEtcdTls({etcd.ca_file(), d + "/zerod.pem", d + "/zerod.key"});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->enabled());
  EXPECT_THAT(loaded->cert_pem, HasSubstr("BEGIN CERTIFICATE"));
}

TEST_F(EtcdSecurityTest, EveryMemberOfAPlaintextEtcdLetsAnyoneIn) {
  EtcdCluster etcd(3);
  ASSERT_EQ(etcd.error(), "");
  const EtcdOptions options = Options(etcd);
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
  EXPECT_EQ(EtcdEndpointsOpenToAnyone(options, kProbeTimeout), etcd.Endpoints());
  // A member that is down is not counted either way.
  etcd.Kill(2);
  EXPECT_THAT(EtcdEndpointsOpenToAnyone(options, kProbeTimeout),
              ElementsAre(etcd.Endpoint(0), etcd.Endpoint(1)));
}

TEST_F(EtcdSecurityTest, TlsThatTakesClientsWithoutCertificatesLetsAnyoneIn) {
  EtcdCluster etcd(1, EtcdSecurity{.tls = true, .client_certs = false});
  ASSERT_EQ(etcd.error(), "");
  const EtcdOptions options = Options(etcd);
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
  EXPECT_THAT(EtcdEndpointsOpenToAnyone(options, kProbeTimeout), ElementsAre(etcd.Endpoint(0)));
}

TEST_F(EtcdSecurityTest, ASecuredEtcdLetsZerodAtItsKeysOnlyAndNobodyElseIn) {
  EtcdCluster etcd(3, EtcdSecurity{.tls = true, .auth = true, .zerod_prefix = "/zerod/"});
  ASSERT_EQ(etcd.error(), "");
  const EtcdOptions options = Options(etcd);
  EXPECT_TRUE(CheckEtcdAccess(options).ok());
  EXPECT_TRUE(EtcdEndpointsOpenToAnyone(options, kProbeTimeout).empty());
  // Another prefix is not zerod's role's: refused, saying what to grant.
  const absl::Status other = CheckEtcdAccess(Options(etcd, "/other/"));
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_THAT(other.message(), HasSubstr("grant its role readwrite on /other/ (prefix), "
                                         "/other.claim, /other.commit/ (prefix)"));
  // Without a certificate zerod is no one: its own access fails.
  EtcdOptions anonymous = options;
  anonymous.tls.cert_pem.clear();
  anonymous.tls.key_pem.clear();
  EXPECT_FALSE(CheckEtcdAccess(anonymous).ok());

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

}  // namespace
}  // namespace zerod::server
