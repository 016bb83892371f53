// Which certificate names the etcd client takes for a member (etcd_client.h): a DNS wildcard
// stands for one whole leftmost label, DNS names match host names and IP SANs addresses, never
// across. The same rules decide the handshakes in etcd_security_test, against real etcds.

#include "server/state/internal/etcd_client.h"

#include "gtest/gtest.h"

namespace zerod::server::internal {
namespace {

TEST(NameCovers, AnExactNameCaseAside) {
  EXPECT_TRUE(NameCovers("etcd-0.etcd.zerod.svc", "etcd-0.etcd.zerod.svc"));
  EXPECT_TRUE(NameCovers("ETCD-0.Etcd", "etcd-0.etcd"));
  EXPECT_FALSE(NameCovers("etcd-0.etcd", "etcd-1.etcd"));
  EXPECT_FALSE(NameCovers("etcd-0.etcd", "etcd-0.etcd.evil"));
  EXPECT_FALSE(NameCovers("", ""));
  EXPECT_FALSE(NameCovers("etcd", ""));
}

TEST(NameCovers, AWildcardIsOneWholeLeftmostLabel) {
  EXPECT_TRUE(NameCovers("*.etcd.zerod.svc", "etcd-0.etcd.zerod.svc"));
  EXPECT_TRUE(NameCovers("*.ETCD", "a.etcd"));
  // Not two labels, not none, not a suffix of a label.
  EXPECT_FALSE(NameCovers("*.etcd.zerod.svc", "a.etcd-0.etcd.zerod.svc"));
  EXPECT_FALSE(NameCovers("*.etcd", "a.b.etcd"));
  EXPECT_FALSE(NameCovers("*.etcd", "etcd"));
  EXPECT_FALSE(NameCovers("*.etcd", ".etcd"));
  EXPECT_FALSE(NameCovers("*.etcd", "xetcd"));
  // Only a whole label: "e*" and "*" alone are names like any other, matched exactly.
  EXPECT_FALSE(NameCovers("e*.etcd", "etcd-0.etcd"));
  EXPECT_FALSE(NameCovers("*", "localhost"));
  EXPECT_FALSE(NameCovers("*.", "a."));
}

TEST(CertificateNamesOneOf, DnsNamesMatchHostNamesAndIpNamesAddressesNeverAcross) {
  const EndpointNames by_name{.dns = {"etcd-0.etcd"}, .ips = {"10.0.0.5"}};
  EXPECT_TRUE(CertificateNamesOneOf({"*.etcd"}, {}, by_name));
  EXPECT_TRUE(CertificateNamesOneOf({}, {"10.0.0.5"}, by_name));
  EXPECT_FALSE(CertificateNamesOneOf({"other.etcd.x"}, {"10.0.0.6"}, by_name));
  EXPECT_FALSE(CertificateNamesOneOf({}, {}, by_name));
  // An endpoint given as an address: a DNS wildcard, or a DNS name spelling the address, is no IP
  // SAN and covers nothing.
  const EndpointNames by_address{.dns = {}, .ips = {"127.0.0.1"}};
  EXPECT_FALSE(CertificateNamesOneOf({"*.0.0.1"}, {}, by_address));
  EXPECT_FALSE(CertificateNamesOneOf({"127.0.0.1"}, {}, by_address));
  EXPECT_TRUE(CertificateNamesOneOf({}, {"127.0.0.1"}, by_address));
  // An IP SAN is compared as an address, however it is spelled; a host name is not one.
  const EndpointNames v6{.dns = {"localhost"}, .ips = {"[::1]"}};
  EXPECT_TRUE(CertificateNamesOneOf({}, {"0:0:0:0:0:0:0:1"}, v6));
  EXPECT_FALSE(CertificateNamesOneOf({}, {"localhost"}, v6));
  EXPECT_TRUE(CertificateNamesOneOf({"localhost"}, {}, v6));
}

}  // namespace
}  // namespace zerod::server::internal
