// The files zerod writes where its flags point (--port-file, --http-port-file, --log-file), against
// what an attacker or an unlucky operator puts there: a link to a file worth keeping, a FIFO, a
// device. Each is refused by name (a usage error, exit 2, one line) and left as it was; a port
// file is written beside its name and renamed over it; a log file swapped for a link before a
// SIGHUP reopen is not appended to through it.

#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

mode_t Kind(const std::string& path) {
  struct stat st;
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & S_IFMT;
}

TEST(OutputFiles, APortOrLogFileThatIsNotARegularFileIsAUsageErrorAndLeftAsItWas) {
  TempDir targets;
  const std::string dir = targets.path();
  const std::string victim = targets.WriteFile("victim", "precious\n");
  const std::string link = dir + "/link";
  fs::create_symlink(victim, link);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::vector<std::pair<std::string, std::string>> cases = {
      {link, "is a symbolic link (to " + victim + ")"}, {fifo, "is a FIFO, not a regular file"}};
  for (const std::string flag : {"--port-file", "--http-port-file", "--log-file"}) {
    for (const auto& [path, said] : cases) {
      std::vector<std::string> flags = {flag, path};
      if (flag == "--http-port-file") flags = {"--http-listen", "127.0.0.1:0", flag, path};
      ZerodHarness zerod;
      const ProcessResult r = zerod.StartRefused(flags, absl::Seconds(60));
      // StartRefused gives stdout and stderr together, as `out`.
      EXPECT_EQ(r.exit_code, 2) << flag << " " << path << ": " << r.out;
      EXPECT_THAT(r.out, AllOf(StartsWith("zerod: " + flag + ": " + path), HasSubstr(said)));
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    }
  }
  EXPECT_EQ(ReadText(victim), "precious\n");
  EXPECT_EQ(Kind(link), static_cast<mode_t>(S_IFLNK));
  EXPECT_EQ(Kind(fifo), static_cast<mode_t>(S_IFIFO));
}

// The case: a device node (needs CAP_MKNOD, which CI's root has).
TEST(OutputFiles, APortOrLogFileThatIsADeviceIsAUsageErrorAndLeftAsItWas) {
  TempDir targets;
  const std::string device = targets.path() + "/null-device";
  if (mknod(device.c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0) {
    GTEST_SKIP() << "mknod refused here (" << std::strerror(errno) << "): no device node to test";
  }
  for (const std::string flag : {"--port-file", "--http-port-file", "--log-file"}) {
    std::vector<std::string> flags = {flag, device};
    if (flag == "--http-port-file") flags = {"--http-listen", "127.0.0.1:0", flag, device};
    ZerodHarness zerod;
    const ProcessResult r = zerod.StartRefused(flags, absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.out;
    EXPECT_THAT(r.out, AllOf(StartsWith("zerod: " + flag + ": " + device),
                             HasSubstr("is a character device, not a regular file")));
  }
  EXPECT_EQ(Kind(device), static_cast<mode_t>(S_IFCHR));
}

TEST(OutputFiles, APortFileReplacesARegularFileWholeAndLeavesNothingBeside) {
  ZerodHarness zerod;
  const std::string port_file = zerod.dir().WriteFile("port", "a much longer old content\n");
  fs::create_hard_link(port_file, zerod.dir().path() + "/other-name");
  ASSERT_NO_FATAL_FAILURE(zerod.Start({"--listen", "127.0.0.1:0", "--port-file", port_file}));
  const std::string port = ReadText(port_file);
  EXPECT_THAT(port, ::testing::MatchesRegex("[1-9][0-9]*\n"));
  // Renamed over, not written in place: the other name keeps the old file.
  EXPECT_EQ(ReadText(zerod.dir().path() + "/other-name"), "a much longer old content\n");
  for (const auto& entry : fs::directory_iterator(zerod.dir().path())) {
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << " left beside the port file";
  }
  EXPECT_EQ(zerod.Terminate(), 0);
}

// logrotate's window: the log file moved away and a link put by its name before the SIGHUP. The
// reopen refuses the link (zerod logs on to the old file), and the file it points to is untouched.
TEST(OutputFiles, ALogFileSwappedForALinkBeforeAReopenIsNotWrittenThrough) {
  ZerodHarness zerod({"--no-auth"});
  const std::string file = zerod.dir().path() + "/zerod.log";
  const std::string victim = zerod.dir().WriteFile("victim", "precious\n");
  ASSERT_NO_FATAL_FAILURE(zerod.Start({"--log-file", file}));
  ASSERT_EQ(std::rename(file.c_str(), (file + ".1").c_str()), 0);
  fs::create_symlink(victim, file);
  zerod.Signal(SIGHUP);
  ASSERT_TRUE(Eventually(
      [&] { return absl::StrContains(ReadText(file + ".1"), "logging to the old file"); },
      absl::Seconds(30)))
      << ReadText(file + ".1");
  EXPECT_THAT(ReadText(file + ".1"), HasSubstr("is a symbolic link"));
  EXPECT_EQ(zerod.Terminate(), 0);
  EXPECT_EQ(ReadText(victim), "precious\n");
  EXPECT_THAT(ReadText(file + ".1"), HasSubstr("stopped"));
}

}  // namespace
}  // namespace zerod::testing
