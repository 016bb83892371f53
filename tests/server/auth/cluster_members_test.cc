// ClusterMembers against certificates made as an operator makes them (deploy/etcd/certs.sh): a
// member's certificate chains to the cluster's CA; a certificate of another CA does not, whatever
// it is named, nor does anything that is not a certificate.

#include "server/auth/cluster_members.h"

#include <fstream>
#include <sstream>
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

TEST(ClusterMembers, ACaFileWithoutACertificateIsRefusedNamingTheFlag) {
  auto members = ClusterMembers::FromPem("not a certificate");
  ASSERT_FALSE(members.ok());
  EXPECT_THAT(members.status().message(), HasSubstr("--cluster-ca"));
}

}  // namespace
}  // namespace zerod::server::auth
