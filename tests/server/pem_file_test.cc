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
  if (geteuid() == 0) {
    ASSERT_EQ(chown(key.c_str(), 65534, 65534), 0);
    EXPECT_THAT(Refusal(ReadPrivateKeyFile(key, "--tls-key")),
                HasSubstr("--tls-key: " + key + ": owned by uid 65534, not zerod's"));
  }
}

// systemd's credentials directory (LoadCredential=): root's, 0500 or so, its files root's with an
// ACL for the service's user, whose mask shows as group bits.
class CredentialsDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root, to make a directory as systemd does";
    ASSERT_EQ(chmod(dir_.path().c_str(), 0500), 0);
    ASSERT_EQ(setenv("CREDENTIALS_DIRECTORY", dir_.path().c_str(), 1), 0);
  }
  void TearDown() override {
    unsetenv("CREDENTIALS_DIRECTORY");
    chmod(dir_.path().c_str(), 0700);
  }
  // A key in it, of `mode`, owned by `uid`.
  std::string Key(mode_t mode, uid_t uid = 0) {
    chmod(dir_.path().c_str(), 0700);
    const std::string key = dir_.WriteFile("etcd.key", kPem);
    EXPECT_EQ(chmod(key.c_str(), mode), 0);
    EXPECT_EQ(chown(key.c_str(), uid, uid), 0);
    chmod(dir_.path().c_str(), 0500);
    return key;
  }
  TempDir dir_;
};

TEST_F(CredentialsDirectory, ItsKeysMayBeReadByTheirGroupThroughAnAclButNeverByOthers) {
  EXPECT_TRUE(ReadPrivateKeyFile(Key(0440), "--etcd-key").ok());
  EXPECT_TRUE(ReadPrivateKeyFile(Key(0400), "--etcd-key").ok());
  for (const mode_t mode : {0444, 0404, 0442}) {
    EXPECT_THAT(Refusal(ReadPrivateKeyFile(Key(mode), "--etcd-key")),
                HasSubstr("lets others read it: a private key must be zerod's alone"))
        << mode;
  }
  // Neither root's nor zerod's: another user's file.
  EXPECT_THAT(Refusal(ReadPrivateKeyFile(Key(0400, 65534), "--etcd-key")),
              HasSubstr("owned by uid 65534, not zerod's"));
  // Outside the directory, the mode counts in full.
  TempDir elsewhere;
  const std::string outside = elsewhere.WriteFile("etcd.key", kPem);
  ASSERT_EQ(chmod(outside.c_str(), 0440), 0);
  EXPECT_THAT(Refusal(ReadPrivateKeyFile(outside, "--etcd-key")), HasSubstr("mode 0440"));
}

TEST_F(CredentialsDirectory, ADirectoryThatIsNotRootsAloneIsNoCredentialsDirectory) {
  const std::string key = Key(0440);
  // Writable by its group or others (anyone could have put the file there), or another user's.
  for (const mode_t mode : {0570, 0507, 0777}) {
    ASSERT_EQ(chmod(dir_.path().c_str(), mode), 0);
    EXPECT_THAT(Refusal(ReadPrivateKeyFile(key, "--etcd-key")),
                HasSubstr("$CREDENTIALS_DIRECTORY " + dir_.path() + " is not root's alone"))
        << mode;
  }
  ASSERT_EQ(chmod(dir_.path().c_str(), 0500), 0);
  ASSERT_EQ(chown(dir_.path().c_str(), 65534, 65534), 0);
  EXPECT_THAT(Refusal(ReadPrivateKeyFile(key, "--etcd-key")), HasSubstr("is not root's alone"));
  ASSERT_EQ(chown(dir_.path().c_str(), 0, 0), 0);
  EXPECT_TRUE(ReadPrivateKeyFile(key, "--etcd-key").ok());
}

}  // namespace
}  // namespace zerod::server
