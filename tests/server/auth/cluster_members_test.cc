// ClusterMembers against certificates made as an operator makes them (deploy/etcd/certs.sh): a
// member's certificate chains to the cluster's CA, an intermediate given alone included; a
// certificate of another CA does not, whatever it is named, nor does anything that is not a
// certificate, nor one that has expired, cached verdict or not (on a fake clock).

#include "server/auth/cluster_members.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/clock.h"
#include "tests/util/certificates.h"
#include "tests/util/subprocess.h"

namespace zerod::server::auth {
namespace {

using ::testing::HasSubstr;
using zerod::testing::IssueCertificate;
using zerod::testing::MakeCa;
using zerod::testing::MakeIntermediateCa;
using zerod::testing::RunProcess;
using zerod::testing::TempDir;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ClusterMembersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& error :
         {MakeCa(dir_.path(), "cluster-ca"), MakeCa(dir_.path(), "other-ca"),
          IssueCertificate(dir_.path(), "cluster-ca", "member", "zerod-member", "DNS:node-1"),
          IssueCertificate(dir_.path(), "other-ca", "impostor", "zerod-member", "DNS:node-1")}) {
      ASSERT_EQ(error, "");
    }
    auto members = ClusterMembers::FromPem(Read(dir_.path() + "/cluster-ca.pem"));
    ASSERT_TRUE(members.ok()) << members.status();
    members_ = *std::move(members);
  }
  std::string Pem(const std::string& name) { return Read(dir_.path() + "/" + name + ".pem"); }

  TempDir dir_;
  std::unique_ptr<ClusterMembers> members_;
};

TEST_F(ClusterMembersTest, AMembersCertificateIsAMembersWithOrWithoutAChain) {
  EXPECT_TRUE(members_->IsMember(Pem("member"), ""));
  // gRPC's chain property holds the leaf too.
  EXPECT_TRUE(members_->IsMember(Pem("member"), Pem("member")));
  // Asked again (a connection's next call): the cached verdict, the same.
  EXPECT_TRUE(members_->IsMember(Pem("member"), ""));
}

TEST_F(ClusterMembersTest, NoOtherCertificateIsAMembers) {
  // Named as a member, signed by another CA; even with that CA sent along as its chain.
  EXPECT_FALSE(members_->IsMember(Pem("impostor"), ""));
  EXPECT_FALSE(members_->IsMember(Pem("impostor"), Pem("impostor") + Pem("other-ca")));
  // The other CA's own certificate, and the cluster CA's (a CA, not a member's client
  // certificate: its holder signs members, it does not call as one).
  EXPECT_FALSE(members_->IsMember(Pem("other-ca"), ""));
  EXPECT_FALSE(members_->IsMember(Pem("cluster-ca"), ""));
  EXPECT_FALSE(members_->IsMember("", ""));
  EXPECT_FALSE(members_->IsMember("-----BEGIN CERTIFICATE-----\nnot base64\n", ""));
  // Two leaves where one is expected.
  EXPECT_FALSE(members_->IsMember(Pem("member") + Pem("impostor"), ""));
}

TEST_F(ClusterMembersTest, AnIntermediateGivenAloneIsTheAnchorAndItsRootsOtherCertificatesAreNot) {
  ASSERT_EQ(MakeIntermediateCa(dir_.path(), "cluster-ca", "members-ca"), "");
  ASSERT_EQ(IssueCertificate(dir_.path(), "members-ca", "member2", "zerod-member"), "");
  auto members = ClusterMembers::FromPem(Pem("members-ca"));
  ASSERT_TRUE(members.ok()) << members.status();
  EXPECT_TRUE((*members)->IsMember(Pem("member2"), ""));
  EXPECT_TRUE((*members)->IsMember(Pem("member2"), Pem("member2") + Pem("members-ca")));
  // Signed by the root above it, not by it: no member, even with the root sent along.
  EXPECT_FALSE((*members)->IsMember(Pem("member"), ""));
  EXPECT_FALSE((*members)->IsMember(Pem("member"), Pem("member") + Pem("cluster-ca")));
}

TEST_F(ClusterMembersTest, ACaOfClientsCoveredByTheClustersIsFoundWhereverItSits) {
  ASSERT_EQ(MakeIntermediateCa(dir_.path(), "cluster-ca", "clients-under-cluster"), "");
  ASSERT_EQ(MakeIntermediateCa(dir_.path(), "other-ca", "clients-elsewhere"), "");
  // The cluster's own CA, and a CA it signed (its holder could sign members).
  EXPECT_TRUE(members_->Covers(Pem("cluster-ca")));
  EXPECT_TRUE(members_->Covers(Pem("clients-under-cluster")));
  EXPECT_TRUE(members_->Covers(Pem("other-ca") + Pem("clients-under-cluster")));
  EXPECT_FALSE(members_->Covers(Pem("other-ca")));
  EXPECT_FALSE(members_->Covers(Pem("clients-elsewhere") + Pem("other-ca")));
  EXPECT_FALSE(members_->Covers(""));
  // The root above an intermediate cluster CA signs the cluster's CA, not through it: its other
  // certificates are no members (the test above), so it may be the clients' CA.
  ASSERT_EQ(MakeIntermediateCa(dir_.path(), "cluster-ca", "members-ca"), "");
  auto intermediate = ClusterMembers::FromPem(Pem("members-ca"));
  ASSERT_TRUE(intermediate.ok());
  EXPECT_FALSE((*intermediate)->Covers(Pem("cluster-ca")));
}

// When the certificate DIR/NAME.pem stops (or starts) being valid: openssl's -enddate (-startdate).
absl::Time CertificateTime(const std::string& path, const std::string& which) {
  const zerod::testing::ProcessResult r =
      RunProcess({"/usr/bin/openssl", "x509", "-noout", "-" + which, "-in", path});
  std::string text(absl::StripAsciiWhitespace(r.out));
  text = text.substr(text.find('=') + 1);  // "notAfter=Dec  8 21:40:00 2027 GMT"
  absl::Time t;
  std::string error;
  EXPECT_TRUE(absl::ParseTime("%b %e %H:%M:%S %Y GMT", text, &t, &error)) << text << error;
  return t;
}

TEST_F(ClusterMembersTest, AVerdictLastsAMinuteAtMostAndNeverPastTheCertificatesEnd) {
  ASSERT_EQ(IssueCertificate(dir_.path(), "cluster-ca", "short", "zerod-member", "", 1), "");
  const absl::Time not_before = CertificateTime(dir_.path() + "/short.pem", "startdate");
  const absl::Time not_after = CertificateTime(dir_.path() + "/short.pem", "enddate");
  ASSERT_EQ(not_after - not_before, absl::Hours(24));
  // Before it is valid: no member, and that verdict stands for a minute.
  server::FakeClock clock(not_before - absl::Seconds(30));
  auto members = ClusterMembers::FromPem(Pem("cluster-ca"), &clock);
  ASSERT_TRUE(members.ok());
  EXPECT_FALSE((*members)->IsMember(Pem("short"), ""));
  clock.Advance(absl::Seconds(40));
  EXPECT_FALSE((*members)->IsMember(Pem("short"), ""));
  clock.Advance(absl::Seconds(30));
  EXPECT_TRUE((*members)->IsMember(Pem("short"), ""));
  // Ten seconds before its end it is a member; ten seconds after, no longer, though a minute has
  // not passed since.
  clock.Advance(not_after - absl::Seconds(10) - clock.Now());
  EXPECT_TRUE((*members)->IsMember(Pem("short"), ""));
  clock.Advance(absl::Seconds(20));
  EXPECT_FALSE((*members)->IsMember(Pem("short"), ""));
}

TEST(ClusterMembers, ACaFileWithoutACertificateIsRefusedNamingTheFlag) {
  auto members = ClusterMembers::FromPem("not a certificate");
  ASSERT_FALSE(members.ok());
  EXPECT_THAT(members.status().message(), HasSubstr("--cluster-ca"));
}

}  // namespace
}  // namespace zerod::server::auth
