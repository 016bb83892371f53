// A damaged checkpoint, as Verify and Restore see it: one flipped byte, a truncated file, a
// missing file, a missing manifest (a partial save). Each error names the file and the problem;
// Restore refuses before it loads anything damaged.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <vector>

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
  std::ofstream(manifest) << "{\"format_version\": 2}";
  s = Verify(dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("field 'manifest_xxh3' is missing"));
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One character of the manifest changed, each in a field a resumed run would take as it is: the
// Adam step count, the trainer's own data, the loss scale. Verify and every read of the manifest
// refuse it, naming the manifest's checksum.
TEST_F(DamagedCheckpoint, AOneCharacterEditOfTheManifestIsDetected) {
  const std::string manifest = dir_ + "/" + kManifestName;
  const std::string saved = ReadText(manifest);
  for (const auto& [field, from, to] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"applied_steps", "\"applied_steps\": 2", "\"applied_steps\": 1"},
           {"user", "sample 1234", "sample 1284"},
           {"loss_scale", "\"loss_scale\": 65536", "\"loss_scale\": 75536"},
           {"one rank file's checksum", "\"xxh3\": \"", ""}}) {
    std::string edited = saved;
    const size_t at = edited.find(from);
    ASSERT_NE(at, std::string::npos) << field << " not found in " << saved;
    if (to.empty()) {  // the first hex digit after `from`, changed
      char& digit = edited[at + from.size()];
      digit = digit == '0' ? '1' : '0';
    } else {
      edited.replace(at, from.size(), to);
    }
    ASSERT_EQ(edited.size(), saved.size()) << field;
    std::ofstream(manifest, std::ios::binary | std::ios::trunc) << edited;
    for (const absl::Status& s : {Verify(dir_), ReadManifest(dir_).status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << field << ": " << s;
      EXPECT_THAT(std::string(s.message()),
                  AllOf(HasSubstr(manifest), HasSubstr("checksum"), HasSubstr("edited or damaged")))
          << field;
    }
  }
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << saved;
  EXPECT_TRUE(Verify(dir_).ok()) << Verify(dir_);
}

// A manifest written before manifests had a checksum (format 1) is refused, never read as if it
// had been checked: the message names the way to vouch for it (zeroctl checkpoint upgrade).
TEST_F(DamagedCheckpoint, AManifestThatPredatesTheChecksumIsRefusedNamingTheUpgrade) {
  const std::string manifest = dir_ + "/" + kManifestName;
  auto m = ReadManifest(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  std::string legacy = ReadText(manifest);
  legacy.replace(legacy.find("\"format_version\": 2"), 19, "\"format_version\": 1");
  const size_t field = legacy.find(" \"manifest_xxh3\"");
  ASSERT_NE(field, std::string::npos);
  legacy.erase(field, legacy.find('\n', field) + 1 - field);
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << legacy;
  for (const absl::Status& s : {Verify(dir_), ReadManifest(dir_).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr(manifest), HasSubstr("format 1"), HasSubstr("no checksum"),
                      HasSubstr("zeroctl checkpoint upgrade " + dir_)));
  }
  // Upgraded, after every rank file was checked against it, it reads as it was written.
  ASSERT_TRUE(UpgradeManifest(dir_).ok()) << UpgradeManifest(dir_);
  auto upgraded = ReadManifest(dir_);
  ASSERT_TRUE(upgraded.ok()) << upgraded.status();
  EXPECT_EQ(upgraded->counters.applied_steps, m->counters.applied_steps);
  EXPECT_EQ(upgraded->user, m->user);
  EXPECT_TRUE(Verify(dir_).ok());
  // A damaged rank file is no checkpoint to vouch for.
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << legacy;
  fs::resize_file(File(1), fs::file_size(File(1)) - 1);
  absl::Status refused = UpgradeManifest(dir_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_EQ(ReadText(manifest), legacy) << "the legacy manifest was replaced";
}

}  // namespace
}  // namespace zerod::checkpoint
