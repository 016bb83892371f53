// The TLS flags read once at start (auth::LoadTls), against certificates made as an operator makes
// them (deploy/etcd/certs.sh): the key must be zerod's alone whatever the store, and a CA of
// clients must not reach into the cluster's CA, as the same CA, or as a CA it signed.

#include "server/auth/transport_security.h"

#include <sys/stat.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/certificates.h"
#include "tests/util/subprocess.h"

namespace zerod::server::auth {
namespace {

using ::testing::HasSubstr;
using zerod::testing::IssueCertificate;
using zerod::testing::MakeCa;
using zerod::testing::MakeIntermediateCa;
using zerod::testing::TempDir;

class LoadTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& error :
         {MakeCa(d(), "cluster-ca"), MakeCa(d(), "clients-ca"),
          IssueCertificate(d(), "cluster-ca", "member", "zerod-member", "DNS:localhost"),
          MakeIntermediateCa(d(), "cluster-ca", "clients-under-cluster")}) {
      ASSERT_EQ(error, "");
    }
  }
  const std::string& d() const { return dir_.path(); }
  TlsFiles Member(const std::string& client_ca = "") const {
    return {.cert = d() + "/member.pem",
            .key = d() + "/member.key",
            .client_ca = client_ca.empty() ? "" : d() + "/" + client_ca + ".pem",
            .cluster_ca = d() + "/cluster-ca.pem"};
  }
  std::string Refusal(const TlsFiles& files) const {
    auto tls = LoadTls(files);
    EXPECT_FALSE(tls.ok());
    EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(tls.status().message());
  }

  TempDir dir_;
};

TEST_F(LoadTlsTest, ReadsEachFileAndTheKeyMustBeZerodsAloneWithOrWithoutACluster) {
  auto tls = LoadTls(Member("clients-ca"));
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_THAT(tls->cert, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(tls->key, HasSubstr("PRIVATE KEY"));
  EXPECT_THAT(tls->client_ca, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(tls->cluster_ca, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_FALSE(LoadTls({}).value().enabled());
  // The listener's key alone (SQLite, no cluster) is as private as a member's.
  ASSERT_EQ(chmod((d() + "/member.key").c_str(), 0644), 0);
  EXPECT_THAT(Refusal({.cert = d() + "/member.pem", .key = d() + "/member.key"}),
              HasSubstr("--tls-key: " + d() + "/member.key: mode 0644 lets others read it"));
  EXPECT_THAT(Refusal(Member()), HasSubstr("--tls-key: "));
  ASSERT_EQ(chmod((d() + "/member.key").c_str(), 0600), 0);
  EXPECT_THAT(Refusal({.cert = d() + "/member.pem"}), HasSubstr("--tls-cert and --tls-key go"));
  EXPECT_THAT(Refusal({.cluster_ca = d() + "/cluster-ca.pem"}),
              HasSubstr("--tls-cert and --tls-key go"));
  EXPECT_THAT(Refusal({.cert = d() + "/member.pem",
                       .key = d() + "/member.key",
                       .cluster_ca = d() + "/absent.pem"}),
              HasSubstr("--cluster-ca: " + d() + "/absent.pem: cannot read"));
}

TEST_F(LoadTlsTest, AClientCaThatIsOrChainsToTheClustersIsRefused) {
  // The same CA, and a CA the cluster's signed: either's clients would pass for members.
  for (const char* client_ca : {"cluster-ca", "clients-under-cluster"}) {
    SCOPED_TRACE(client_ca);
    EXPECT_THAT(Refusal(Member(client_ca)),
                HasSubstr("--cluster-ca: a certificate of --tls-client-ca is one of its "
                          "certificates or chains to them"));
  }
  EXPECT_TRUE(LoadTls(Member("clients-ca")).ok());
}

}  // namespace
}  // namespace zerod::server::auth
