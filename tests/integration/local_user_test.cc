// What another local user can plant around the real zerod: a program answering on its socket
// path, a link in place of a lock file, a data dir others may write with an admin token or state
// files in it. The daemon takes none of them over: it refuses to start, naming the path, and
// leaves what it found untouched.

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zerod_harness.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kPlantedToken[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// zerod on `socket` and `data_dir`, no TCP, its output in `log`.
std::unique_ptr<ChildProcess> StartZerod(const std::string& socket, const std::string& data_dir,
                                         const std::string& log,
                                         const std::vector<std::string>& flags = {}) {
  std::vector<std::string> argv = {Built(ZEROD_PATH), "--socket", socket,        "--listen", "",
                                   "--data-dir",      data_dir,   "--log-level", "info"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return std::make_unique<ChildProcess>(argv, log);
}

// Whether a program accepts a connection on the Unix socket at `path`.
bool Answers(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool answered =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return answered;
}

// Runs a shell command as the user nobody.
void AsNobody(const std::string& command) {
  const ProcessResult r =
      RunProcess({"/usr/sbin/runuser", "-u", "nobody", "--", "/bin/sh", "-c", command});
  ASSERT_EQ(r.exit_code, 0) << command << ": " << r.err;
}

TEST(LocalUser, ASocketAnotherProgramAnswersOnIsNeverTakenOverButAStaleOneIs) {
  TempDir dir;
  const std::string path = dir.path() + "/zerod.sock";
  // Not a zerod: a plain listener, which holds no PATH.lock.
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  struct stat before {};
  ASSERT_EQ(lstat(path.c_str(), &before), 0);

  auto refused = StartZerod(path, dir.path() + "/data", dir.path() + "/refused.log");
  EXPECT_EQ(refused->Wait(absl::Seconds(30)), 1) << refused->Output();
  EXPECT_THAT(refused->Output(),
              HasSubstr("socket " + path + " is in use by a program that is not a zerod holding " +
                        path + ".lock (it accepted a connection)"));
  // The listener's socket is the same file and still answers.
  struct stat after {};
  ASSERT_EQ(lstat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_TRUE(Answers(path));

  // The listener gone, its socket file is stale: zerod removes it and serves there.
  close(listener);
  ASSERT_EQ(lstat(path.c_str(), &after), 0);
  auto zerod = StartZerod(path, dir.path() + "/data", dir.path() + "/zerod.log");
  client::ClientOptions options;
  options.endpoint = "unix://" + path;
  options.retry_for = Scaled(absl::Seconds(30));
  options.call_timeout = Scaled(options.call_timeout);
  auto client = client::CoordinatorClient::Connect(options);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->ListJobs().ok()) << zerod->Output();
}

TEST(LocalUser, ALinkPlantedAsALockFileIsRefusedAndItsTargetIsUntouched) {
  // Planted in a directory the test owns, so fs.protected_symlinks plays no part.
  TempDir dir;
  const std::string victim = dir.WriteFile("victim", "precious\n");
  const std::string data = dir.path() + "/data";
  ASSERT_EQ(mkdir(data.c_str(), 0700), 0);
  ASSERT_EQ(symlink(victim.c_str(), (data + "/zerod.lock").c_str()), 0);
  auto by_data_lock = StartZerod(dir.path() + "/a.sock", data, dir.path() + "/a.log");
  EXPECT_EQ(by_data_lock->Wait(absl::Seconds(30)), 1);
  EXPECT_THAT(by_data_lock->Output(),
              HasSubstr("lock file " + data +
                        "/zerod.lock is a symbolic link; zerod does not follow it: remove it"));
  EXPECT_EQ(ReadFile(victim), "precious\n");

  // The socket's lock file, with a data dir of its own.
  const std::string socket = dir.path() + "/b.sock";
  ASSERT_EQ(symlink(victim.c_str(), (socket + ".lock").c_str()), 0);
  auto by_socket_lock = StartZerod(socket, dir.path() + "/data-b", dir.path() + "/b.log");
  EXPECT_EQ(by_socket_lock->Wait(absl::Seconds(30)), 1);
  EXPECT_THAT(by_socket_lock->Output(),
              HasSubstr("lock file " + socket + ".lock is a symbolic link"));
  EXPECT_EQ(ReadFile(victim), "precious\n");

  // A lock file that is not the daemon user's own is refused as well.
  const std::string socket_c = dir.path() + "/c.sock";
  std::ofstream(socket_c + ".lock") << "";
  ASSERT_EQ(chown((socket_c + ".lock").c_str(), 65534, 65534), 0);
  auto by_owner = StartZerod(socket_c, dir.path() + "/data-c", dir.path() + "/c.log");
  EXPECT_EQ(by_owner->Wait(absl::Seconds(30)), 1);
  EXPECT_THAT(by_owner->Output(),
              HasSubstr("lock file " + socket_c + ".lock is owned by uid 65534"));
}

TEST(LocalUser, ADataDirOthersMayWriteIsRefusedSoATokenPlantedThereIsNeverAnAdmins) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string shared = dir.path() + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);  // as /tmp
  // nobody makes itself the admin of the daemon root is about to start there.
  ASSERT_NO_FATAL_FAILURE(
      AsNobody(absl::StrCat("umask 077; echo ", kPlantedToken, " > ", shared, "/admin.token")));
  auto zerod = StartZerod(dir.path() + "/zerod.sock", shared, dir.path() + "/zerod.log");
  ASSERT_EQ(zerod->Wait(absl::Seconds(30)), 1) << zerod->Output();
  EXPECT_THAT(zerod->Output(),
              HasSubstr("data dir " + shared +
                        " may be written by others (mode 1777): anyone who can write it can plant "
                        "the state or the admin token; chmod 0700 it"));
  // Nothing it found was changed, and no state was made there.
  EXPECT_EQ(ReadFile(shared + "/admin.token"), absl::StrCat(kPlantedToken, "\n"));
  struct stat st {};
  EXPECT_NE(stat((shared + "/zerod.db").c_str(), &st), 0);

  // A dir of another user, even one nobody else may write, is refused as well.
  const std::string theirs = dir.path() + "/theirs";
  ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  auto in_theirs = StartZerod(dir.path() + "/b.sock", theirs, dir.path() + "/b.log");
  ASSERT_EQ(in_theirs->Wait(absl::Seconds(30)), 1) << in_theirs->Output();
  EXPECT_THAT(in_theirs->Output(),
              HasSubstr("data dir " + theirs + " belongs to uid 65534, not to zerod's user"));
}

TEST(LocalUser, StateFilesAndTokensThatAreAnotherUsersOrLinksAreRefused) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  const std::string elsewhere = dir.WriteFile("elsewhere", std::string(kPlantedToken) + "\n");
  // Each file as it might have been left by someone who could write the dir before it was made
  // private: owned by nobody, or a link to a file of their choosing.
  struct Case {
    std::string file;
    bool link;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"admin.token", false, "admin token " + data + "/admin.token belongs to uid 65534"},
      {"admin.token", true, "admin token " + data + "/admin.token is a symbolic link"},
      {"viewer.token", false, "viewer token " + data + "/viewer.token belongs to uid 65534"},
      {"zerod.db", false, "state file " + data + "/zerod.db belongs to uid 65534"},
      {"zerod.db-wal", true, "state file " + data + "/zerod.db-wal is a symbolic link"},
      {"zerod.state-id", true, "state file " + data + "/zerod.state-id is a symbolic link"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file + (c.link ? " (link)" : ""));
    ASSERT_EQ(RunProcess({"/bin/rm", "-rf", data}).exit_code, 0);
    ASSERT_EQ(mkdir(data.c_str(), 0700), 0);
    const std::string path = data + "/" + c.file;
    if (c.link) {
      ASSERT_EQ(symlink(elsewhere.c_str(), path.c_str()), 0);
    } else {
      std::ofstream(path) << kPlantedToken << "\n";
      ASSERT_EQ(chmod(path.c_str(), 0600), 0);
      ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
    }
    const std::string socket = absl::StrCat(dir.path(), "/", i, ".sock");
    auto zerod = StartZerod(socket, data, absl::StrCat(dir.path(), "/", i++, ".log"));
    ASSERT_EQ(zerod->Wait(absl::Seconds(30)), 1) << zerod->Output();
    EXPECT_THAT(zerod->Output(), HasSubstr(c.expected));
    EXPECT_EQ(ReadFile(elsewhere), absl::StrCat(kPlantedToken, "\n"));
  }
  // --admin-token-file naming a file another user made is refused too.
  const std::string open_dir = dir.path() + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  ASSERT_NO_FATAL_FAILURE(
      AsNobody(absl::StrCat("umask 077; echo ", kPlantedToken, " > ", open_dir, "/admin.token")));
  ASSERT_EQ(RunProcess({"/bin/rm", "-rf", data}).exit_code, 0);
  auto zerod = StartZerod(dir.path() + "/x.sock", data, dir.path() + "/x.log",
                          {"--admin-token-file", open_dir + "/admin.token"});
  ASSERT_EQ(zerod->Wait(absl::Seconds(30)), 1) << zerod->Output();
  EXPECT_THAT(zerod->Output(),
              HasSubstr("admin token " + open_dir + "/admin.token belongs to uid 65534"));
}

}  // namespace
}  // namespace zerod::testing
