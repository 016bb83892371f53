// PEM files named by flags: what is not a regular PEM file of sane size is refused naming the flag,
// and a private key must be zerod's alone.

#include "server/pem_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::HasSubstr;
using zerod::testing::TempDir;

constexpr char kPem[] = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";

std::string Refusal(const absl::StatusOr<std::string>& read) {
  EXPECT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(read.status().message());
}

TEST(PemFile, ReadsAPemFileAndRefusesWhatIsNotOneNamingTheFlag) {
  TempDir dir;
  const std::string pem = dir.WriteFile("ca.pem", kPem);
  auto read = ReadPemFile(pem, "--etcd-ca");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, kPem);
  EXPECT_THAT(Refusal(ReadPemFile(dir.path() + "/absent.pem", "--etcd-ca")),
              HasSubstr("--etcd-ca: " + dir.path() + "/absent.pem: cannot read"));
  EXPECT_THAT(Refusal(ReadPemFile(dir.WriteFile("text", "hello\n"), "--etcd-ca")),
              HasSubstr("not a PEM file"));
  // A device would be read forever, a FIFO would block: neither is a regular file.
  EXPECT_THAT(Refusal(ReadPemFile("/dev/zero", "--tls-cert")),
              HasSubstr("--tls-cert: /dev/zero: not a regular file"));
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(Refusal(ReadPemFile(fifo, "--tls-cert")), HasSubstr("not a regular file"));
  EXPECT_THAT(Refusal(ReadPemFile(dir.WriteFile("huge", std::string(2 << 20, 'x')), "--etcd-ca")),
              HasSubstr("larger than 1 MiB"));
}

TEST(PemFile, APrivateKeyMustBeZerodsAloneThoughALinkToItIsFollowed) {
  TempDir dir;
  const std::string key = dir.WriteFile("zerod.key", kPem);
  ASSERT_EQ(chmod(key.c_str(), 0600), 0);
  EXPECT_TRUE(ReadPrivateKeyFile(key, "--etcd-key").ok());
  // A Kubernetes Secret's files are links into ..data/: the target is what counts.
  const std::string link = dir.path() + "/linked.key";
  ASSERT_EQ(symlink(key.c_str(), link.c_str()), 0);
  EXPECT_TRUE(ReadPrivateKeyFile(link, "--etcd-key").ok());
  for (const mode_t mode : {0640, 0604, 0660}) {
    ASSERT_EQ(chmod(key.c_str(), mode), 0);
    EXPECT_THAT(Refusal(ReadPrivateKeyFile(key, "--etcd-key")),
                HasSubstr("lets others read it: a private key must be zerod's alone"));
  }
  ASSERT_EQ(chmod(key.c_str(), 0400), 0);
  EXPECT_TRUE(ReadPrivateKeyFile(key, "--etcd-key").ok());
  // In systemd's credentials directory, the mode says nothing (an ACL gives it to the service).
  ASSERT_EQ(chmod(key.c_str(), 0440), 0);
  ASSERT_EQ(setenv("CREDENTIALS_DIRECTORY", dir.path().c_str(), 1), 0);
  EXPECT_TRUE(ReadPrivateKeyFile(key, "--etcd-key").ok());
  ASSERT_EQ(unsetenv("CREDENTIALS_DIRECTORY"), 0);
  EXPECT_FALSE(ReadPrivateKeyFile(key, "--etcd-key").ok());
  ASSERT_EQ(chmod(key.c_str(), 0400), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(key.c_str(), 65534, 65534), 0);
    EXPECT_THAT(Refusal(ReadPrivateKeyFile(key, "--tls-key")),
                HasSubstr("--tls-key: " + key + ": owned by uid 65534, not zerod's"));
  }
}

}  // namespace
}  // namespace zerod::server
