// `zeroctl checkpoint verify` and `export`, the real binary on a checkpoint saved by real engines.

#include <filesystem>
#include <fstream>

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
