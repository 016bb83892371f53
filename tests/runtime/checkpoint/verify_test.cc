// A damaged checkpoint, as Verify and Restore see it: one flipped byte, a truncated file, a
// missing file, a missing manifest (a partial save). Each error names the file and the problem;
// Restore refuses before it loads anything damaged.

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "tests/runtime/checkpoint/engine_world.h"
#include "tests/util/subprocess.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::EngineWorld;
using ::testing::HasSubstr;

// A checkpoint saved by 2 ranks at stage 1 after two steps.
class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = StepDirectory(tmp_.path(), 2);
    EngineWorld saver(testing::SmallLayout(), 1, 2, DType::kFloat32);
    ASSERT_TRUE(saver.ok()) << saver.status();
    ASSERT_TRUE(saver.Train(2).ok());
    auto m = saver.Save(dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(Verify(dir_).ok()) << Verify(dir_);
  }
  std::string File(int64_t rank) const { return dir_ + "/" + RankFileName(rank); }

  // Restore on one rank, which reads every file.
  absl::Status RestoreOnOneRank() {
    auto manifest = ReadManifest(dir_);
    if (!manifest.ok()) return manifest.status();
    EngineWorld loader(testing::SmallLayout(), 0, 1, DType::kFloat32);
    return Restore(dir_, *manifest, loader.engine(0));
  }

  zerod::testing::TempDir tmp_;
  std::string dir_;
};

TEST_F(DamagedCheckpoint, OneFlippedByteFailsVerifyAndRestoreNamingTheFile) {
  {
    std::fstream f(File(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(100);
    f.write(&c, 1);
  }
  absl::Status verify = Verify(dir_);
  EXPECT_EQ(verify.code(), absl::StatusCode::kDataLoss) << verify;
  EXPECT_THAT(std::string(verify.message()),
              AllOf(HasSubstr(File(1)), HasSubstr("checksum mismatch in block 0")));
  absl::Status restore = RestoreOnOneRank();
  EXPECT_EQ(restore.code(), absl::StatusCode::kDataLoss) << restore;
  EXPECT_THAT(std::string(restore.message()),
              AllOf(HasSubstr(File(1)), HasSubstr("checksum mismatch")));
}

TEST_F(DamagedCheckpoint, ATruncatedFileSaysHowLongItIsAndShouldBe) {
  const auto size = static_cast<int64_t>(fs::file_size(File(0)));
  fs::resize_file(File(0), static_cast<uintmax_t>(size - 10));
  const std::string want =
      absl::StrCat(File(0), " is truncated: ", size - 10, " bytes, the manifest says ", size);
  absl::Status verify = Verify(dir_);
  EXPECT_EQ(verify.code(), absl::StatusCode::kDataLoss) << verify;
  EXPECT_THAT(std::string(verify.message()), HasSubstr(want));
  absl::Status restore = RestoreOnOneRank();
  EXPECT_EQ(restore.code(), absl::StatusCode::kDataLoss) << restore;
  EXPECT_THAT(std::string(restore.message()), HasSubstr(want));
}

TEST_F(DamagedCheckpoint, AMissingFileIsNamed) {
  fs::remove(File(1));
  absl::Status verify = Verify(dir_);
  EXPECT_EQ(verify.code(), absl::StatusCode::kNotFound) << verify;
  EXPECT_THAT(std::string(verify.message()), HasSubstr(File(1) + " is missing"));
  absl::Status restore = RestoreOnOneRank();
  EXPECT_EQ(restore.code(), absl::StatusCode::kNotFound) << restore;
  EXPECT_THAT(std::string(restore.message()), HasSubstr(File(1) + " is missing"));
}

TEST_F(DamagedCheckpoint, WithoutItsManifestACheckpointIsPartial) {
  fs::remove(dir_ + "/" + kManifestName);
  std::ofstream(File(1) + ".tmp") << "half written";
  for (const absl::Status& s : {ReadManifest(dir_).status(), Verify(dir_)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr(dir_ + " is partial"), HasSubstr("2 rank files (1 being written)"),
                      HasSubstr("no manifest.json")));
  }
  absl::Status root = Verify(tmp_.path());
  EXPECT_EQ(root.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(root.message()),
              HasSubstr(tmp_.path() + " is a checkpoint root (1 step directories)"));
  absl::Status gone = Verify(tmp_.path() + "/step-000000000099");
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.message()), HasSubstr("does not exist"));
}

TEST_F(DamagedCheckpoint, AManifestThatIsNotJsonOrMissesAFieldIsDataLoss) {
  const std::string manifest = dir_ + "/" + kManifestName;
  std::ofstream(manifest) << "{\"format_version\": 1,";
  absl::Status s = Verify(dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(manifest + " is not valid JSON"));
  std::ofstream(manifest) << "{\"format_version\": 1}";
  s = Verify(dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("field 'job_id' is missing"));
}

}  // namespace
}  // namespace zerod::checkpoint
