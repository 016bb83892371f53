// Writing a checkpoint: a disk that fills up mid-save (a real, small tmpfs) fails the file it was
// writing with RESOURCE_EXHAUSTED naming it, leaves no temporary file, and leaves the earlier
// checkpoint in the same root as it was; and a manifest is never written over missing files.

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "tests/runtime/checkpoint/engine_world.h"
#include "tests/util/small_filesystem.h"
#include "tests/util/subprocess.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::EngineWorld;
using ::testing::HasSubstr;

using zerod::testing::SmallFilesystem;

// Fills the filesystem under `path`, then gives `room` bytes back.
void FillLeaving(const std::string& path, off_t room) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const std::string block(64 << 10, 'b');
  off_t size = 0;
  for (;;) {
    const ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) break;
    size += n;
  }
  ASSERT_EQ(::ftruncate(fd, size > room ? size - room : 0), 0);
  ::close(fd);
}

TEST(WriteRankFile, AFullDiskMidSaveIsResourceExhaustedAndLeavesTheEarlierCheckpoint) {
  zerod::testing::TempDir tmp;
  const std::string root = tmp.path() + "/ckpt";
  SmallFilesystem disk(root, "1m");
  if (!disk.mounted()) GTEST_SKIP() << "needs a real small filesystem: " << disk.error();

  EngineWorld world(testing::SmallLayout(), 2, 2, DType::kBFloat16);
  ASSERT_TRUE(world.ok()) << world.status();
  ASSERT_TRUE(world.Train(1).ok());
  const std::string first = StepDirectory(root, 1);
  ASSERT_TRUE(world.Save(first).ok());
  ASSERT_TRUE(world.Train(1).ok());

  // Room for the start of a rank file, not for all of it: the trainer's extra bytes overflow.
  FillLeaving(root + "/ballast", 8 << 10);
  const std::string second = StepDirectory(root, 2);
  fs::create_directories(second);
  auto written = WriteRankFile(second, world.engine(1), std::string(64 << 10, 'x'));
  ASSERT_FALSE(written.ok()) << "the disk never filled";
  EXPECT_EQ(written.status().code(), absl::StatusCode::kResourceExhausted) << written.status();
  EXPECT_THAT(std::string(written.status().message()),
              HasSubstr(second + "/" + RankFileName(1) + ": write failed: no space left"));
  EXPECT_TRUE(fs::is_empty(second)) << "neither the file nor its .tmp is left";
  EXPECT_TRUE(Verify(first).ok()) << Verify(first);

  // The same save once space is back.
  fs::remove(root + "/ballast");
  EXPECT_TRUE(world.Save(second).ok());
  EXPECT_TRUE(Verify(second).ok()) << Verify(second);
  EXPECT_TRUE(Verify(first).ok()) << Verify(first);
}

TEST(WriteManifest, RefusesToCompleteACheckpointWhoseFileIsNotInPlace) {
  zerod::testing::TempDir tmp;
  const std::string dir = StepDirectory(tmp.path(), 1);
  EngineWorld world(testing::SmallLayout(), 1, 2, DType::kFloat32);
  auto manifest = world.Save(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  fs::remove(dir + "/" + kManifestName);
  fs::remove(dir + "/" + RankFileName(1));
  absl::Status s = WriteManifest(dir, *manifest);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + "/" + RankFileName(1) + " is missing"));
  EXPECT_FALSE(fs::exists(dir + "/" + kManifestName));
  EXPECT_FALSE(fs::exists(dir + "/" + std::string(kManifestName) + ".tmp"));
}

}  // namespace
}  // namespace zerod::checkpoint
