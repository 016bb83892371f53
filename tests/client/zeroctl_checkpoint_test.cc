// `zeroctl checkpoint verify` and `export`, the real binary on a checkpoint saved by real engines.

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "tests/runtime/checkpoint/engine_world.h"
#include "tests/util/subprocess.h"

namespace zerod::zeroctl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using zerod::testing::RunProcess;

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ZeroctlCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = checkpoint::StepDirectory(tmp_.path(), 2);
    checkpoint::testing::EngineWorld world(checkpoint::testing::SmallLayout(), 2, 3,
                                           DType::kBFloat16);
    ASSERT_TRUE(world.ok()) << world.status();
    ASSERT_TRUE(world.Train(2).ok());
    ASSERT_TRUE(world.Save(dir_).ok());
  }
  zerod::testing::TempDir tmp_;
  std::string dir_;
};

TEST_F(ZeroctlCheckpoint, VerifySaysOkWithTheStepRanksFilesAndBytes) {
  const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "verify", dir_});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    bytes += static_cast<int64_t>(entry.file_size());
  }
  EXPECT_EQ(r.out, absl::StrCat(dir_, ": ok, step 2, 3 ranks, 4 files, ", bytes, " bytes\n"));
}

TEST_F(ZeroctlCheckpoint, VerifyOfADamagedCheckpointExitsOneNamingTheFile) {
  const std::string file = dir_ + "/" + checkpoint::RankFileName(2);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(7);
    f.put('\x7f');
  }
  const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "verify", dir_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith("zeroctl: " + file + ": checksum mismatch in block 0"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  std::filesystem::remove(dir_ + "/" + checkpoint::kManifestName);
  const auto partial = RunProcess({ZEROCTL_PATH, "checkpoint", "verify", dir_});
  EXPECT_EQ(partial.exit_code, 1);
  EXPECT_THAT(partial.err, HasSubstr(dir_ + " is partial"));
}

// The case: `applied_steps` 2 -> 1 in the manifest of a real checkpoint, one character.
TEST_F(ZeroctlCheckpoint, VerifyRefusesAManifestEditedByOneCharacter) {
  const std::string manifest = dir_ + "/" + checkpoint::kManifestName;
  std::string text = Contents(manifest);
  const size_t at = text.find("\"applied_steps\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 17] = '1';
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
  const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "verify", dir_});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith("zeroctl: " + manifest + ": checksum"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A checkpoint saved before manifests had a checksum (format 1): refused by verify, naming the
// way on; `upgrade` checks its files and gives it one; then it verifies.
TEST_F(ZeroctlCheckpoint, UpgradeGivesAFormatOneManifestItsChecksumAfterCheckingTheFiles) {
  auto manifest = checkpoint::ReadManifest(dir_);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->format_version = 1;
  std::ofstream(dir_ + "/" + checkpoint::kManifestName, std::ios::trunc)
      << checkpoint::ManifestToJson(*manifest);
  const auto refused = RunProcess({ZEROCTL_PATH, "checkpoint", "verify", dir_});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("`zeroctl checkpoint upgrade " + dir_ + "`"));
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
  const auto upgraded = RunProcess({ZEROCTL_PATH, "checkpoint", "upgrade", dir_});
  EXPECT_EQ(upgraded.exit_code, 0) << upgraded.err;
  EXPECT_EQ(upgraded.out, dir_ +
                              ": checked 3 rank files against its format-1 manifest and gave it "
                              "a checksum (format 2), step 2\n");
  EXPECT_EQ(RunProcess({ZEROCTL_PATH, "checkpoint", "verify", dir_}).exit_code, 0);
  const auto again = RunProcess({ZEROCTL_PATH, "checkpoint", "upgrade", dir_});
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_THAT(again.out, HasSubstr("already has a checksum"));
}

TEST_F(ZeroctlCheckpoint, ExportWritesTheSafetensorsFile) {
  const std::string out = tmp_.path() + "/model.safetensors";
  const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "export", dir_, "--out", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("wrote " + out + ": 7 tensors"));
  EXPECT_TRUE(std::filesystem::exists(out));

  const auto unwritable =
      RunProcess({ZEROCTL_PATH, "checkpoint", "export", dir_, "--out", "/nonexistent/m.st"});
  EXPECT_EQ(unwritable.exit_code, 1);
  EXPECT_THAT(unwritable.err, HasSubstr("/nonexistent/m.st"));
}

// What the export is pointed at: anything but a regular file is refused (exit 2, one line naming
// it) and left exactly as it was; nothing is written through a link.
TEST_F(ZeroctlCheckpoint, ExportRefusesATargetThatIsNotARegularFileAndLeavesItAsItWas) {
  const std::string victim = tmp_.WriteFile("victim", "precious");
  const std::string fifo = tmp_.path() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = tmp_.path() + "/link";
  std::filesystem::create_symlink(victim, link);
  const std::string dangling = tmp_.path() + "/dangling";
  std::filesystem::create_symlink(tmp_.path() + "/nowhere", dangling);
  const std::string directory = tmp_.path() + "/a-directory";
  std::filesystem::create_directory(directory);
  struct Case {
    std::string out;
    std::string said;
  };
  std::vector<Case> cases = {{fifo, "is a FIFO, not a regular file"},
                             {link, "is a symbolic link (to " + victim + ")"},
                             {dangling, "is a symbolic link"},
                             {directory, "is a directory"}};
  for (const Case& c : cases) {
    const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "export", dir_, "--out", c.out});
    EXPECT_EQ(r.exit_code, 2) << c.out << ": " << r.out << r.err;
    EXPECT_EQ(r.out, "") << c.out;
    EXPECT_THAT(r.err, StartsWith("zeroctl: " + c.out + " " + c.said.substr(0, 2)));
    EXPECT_THAT(r.err, HasSubstr(c.said));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  struct stat st;
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";
  EXPECT_EQ(Contents(victim), "precious");
  EXPECT_FALSE(std::filesystem::exists(tmp_.path() + "/nowhere"));
  // Nothing was left beside the targets either.
  for (const auto& entry : std::filesystem::directory_iterator(tmp_.path())) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

// The case: a device node. A null device of our own (mknod needs CAP_MKNOD, which CI's
// root has; a test never points at the real /dev/null).
TEST_F(ZeroctlCheckpoint, ExportRefusesADeviceNodeAndLeavesItAsItWas) {
  const std::string device = tmp_.path() + "/null-device";
  if (mknod(device.c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0) {
    GTEST_SKIP() << "mknod refused here (" << std::strerror(errno) << "): no device node to test";
  }
  const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "export", dir_, "--out", device});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.err, "zeroctl: " + device +
                       " is a character device, not a regular file: refusing to write to it\n");
  struct stat st;
  ASSERT_EQ(lstat(device.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device was replaced";
}

// A link planted where a writer that names its temporary file `<out>.tmp` would write: the export
// writes a file of its own beside the target and never touches the link or what it points to.
TEST_F(ZeroctlCheckpoint, ExportNeverWritesThroughALinkPlantedBesideTheTarget) {
  const std::string victim = tmp_.WriteFile("victim", "precious");
  const std::string out = tmp_.path() + "/model.safetensors";
  std::filesystem::create_symlink(victim, out + ".tmp");
  const auto r = RunProcess({ZEROCTL_PATH, "checkpoint", "export", dir_, "--out", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Contents(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(out + ".tmp"));
  EXPECT_FALSE(std::filesystem::is_symlink(out));
  EXPECT_GT(std::filesystem::file_size(out), 8u);
  // An existing regular file is replaced whole.
  std::ofstream(out) << "old";
  const auto again = RunProcess({ZEROCTL_PATH, "checkpoint", "export", dir_, "--out", out});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_GT(std::filesystem::file_size(out), 8u);
}

TEST(ZeroctlCheckpointUsage, MissingArgumentsAreUsageErrors) {
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{ZEROCTL_PATH, "checkpoint"},
        {ZEROCTL_PATH, "checkpoint", "verify"},
        {ZEROCTL_PATH, "checkpoint", "export", "/tmp"},
        {ZEROCTL_PATH, "checkpoint", "frobnicate", "/tmp"}}) {
    const auto r = RunProcess(argv);
    EXPECT_EQ(r.exit_code, 2) << argv.back() << ": " << r.out << r.err;
    EXPECT_THAT(r.err, StartsWith("zeroctl: "));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace zerod::zeroctl
