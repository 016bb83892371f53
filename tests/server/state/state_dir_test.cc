#include "server/state/state_dir.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<SqliteKvStore> OpenOk(const std::string& dir, bool reset = false) {
  auto kv = OpenStateDir(dir, StateDirOptions{Durability::kNormal, reset});
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? *std::move(kv) : nullptr;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(StateDir, AFreshDirGetsAStateAndAMarkerHoldingItsIdBothOwnerOnly) {
  testing::TempDir dir;
  auto kv = OpenOk(dir.path());
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(ReadAll(StateMarkerPath(dir.path())), kv->state_id() + "\n");
  EXPECT_EQ(ModeOf(StateDatabasePath(dir.path())), 0600u);
  EXPECT_EQ(ModeOf(StateMarkerPath(dir.path())), 0600u);
  kv.reset();
  EXPECT_NE(OpenOk(dir.path()), nullptr);
}

// A link planted where a writer with a fixed temporary name would write the marker
// (`zerod.state-id.tmp`, as zerod wrote it before): the marker is written under a fresh name
// beside it and renamed, never through the link.
TEST(StateDir, TheMarkerIsNeverWrittenThroughALinkPlantedBesideIt) {
  testing::TempDir dir;
  testing::TempDir elsewhere;
  const std::string victim = elsewhere.WriteFile("victim", "precious\n");
  fs::create_symlink(victim, StateMarkerPath(dir.path()) + ".tmp");
  auto kv = OpenOk(dir.path());
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(ReadAll(victim), "precious\n");
  EXPECT_TRUE(fs::is_symlink(StateMarkerPath(dir.path()) + ".tmp"));
  EXPECT_FALSE(fs::is_symlink(StateMarkerPath(dir.path())));
  EXPECT_EQ(ReadAll(StateMarkerPath(dir.path())), kv->state_id() + "\n");
  EXPECT_EQ(ModeOf(StateMarkerPath(dir.path())), 0600u);
}

TEST(StateDir, AStateFromBeforeMarkersIsAdopted) {
  testing::TempDir dir;
  std::string id;
  {
    auto kv = OpenOk(dir.path());
    ASSERT_TRUE(kv->CommitSync({KvOp::Put("a", "1")}).ok());
    id = kv->state_id();
  }
  fs::remove(StateMarkerPath(dir.path()));
  auto kv = OpenOk(dir.path());
  EXPECT_EQ(kv->Get("a")->value, "1");
  EXPECT_EQ(ReadAll(StateMarkerPath(dir.path())), id + "\n");
}

TEST(StateDir, WithTheMarkerAMissingEmptyOrForeignStateIsDataLossNamingTheFileAndTheWayOut) {
  testing::TempDir dir, other;
  OpenOk(dir.path());
  OpenOk(other.path());
  const std::string db = StateDatabasePath(dir.path());
  const std::string saved = db + ".saved";
  fs::copy_file(db, saved);

  fs::remove(db);
  auto missing = OpenStateDir(dir.path(), {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr(db + " is missing"), HasSubstr(StateMarkerPath(dir.path())),
                    HasSubstr("--reset-state")));
  EXPECT_FALSE(fs::exists(db));

  std::ofstream(db).close();
  auto empty = OpenStateDir(dir.path(), {});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(empty.status().message(), HasSubstr(db + " is empty (0 bytes)"));

  fs::copy_file(StateDatabasePath(other.path()), db, fs::copy_options::overwrite_existing);
  auto foreign = OpenStateDir(dir.path(), {});
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(foreign.status().message(), HasSubstr("another state's file"));

  fs::copy_file(saved, db, fs::copy_options::overwrite_existing);
  EXPECT_NE(OpenOk(dir.path()), nullptr);
}

TEST(StateDir, ResetMovesEveryStateFileAsideUnderADatedNameAndStartsEmpty) {
  testing::TempDir dir;
  std::string old_id;
  {
    auto kv = OpenOk(dir.path());
    ASSERT_TRUE(kv->CommitSync({KvOp::Put("a", "1")}).ok());
    old_id = kv->state_id();
  }
  const std::string db = StateDatabasePath(dir.path());
  fs::resize_file(db, 0);
  ASSERT_FALSE(OpenStateDir(dir.path(), {}).ok());

  auto kv = OpenOk(dir.path(), /*reset=*/true);
  ASSERT_NE(kv, nullptr);
  EXPECT_FALSE(kv->Get("a").has_value());
  EXPECT_NE(kv->state_id(), old_id);
  int backups = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename();
    if (name.rfind("zerod.db.reset-", 0) == 0) {
      ++backups;
      EXPECT_EQ(fs::file_size(entry.path()), 0u) << "the emptied file, kept as it was";
    }
    if (name.rfind("zerod.state-id.reset-", 0) == 0) {
      EXPECT_EQ(ReadAll(entry.path()), old_id + "\n");
    }
  }
  EXPECT_EQ(backups, 1);
  // A second reset within the same second keeps both backups.
  kv.reset();
  OpenOk(dir.path(), /*reset=*/true);
  OpenOk(dir.path(), /*reset=*/true);
  backups = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename();
    if (name.rfind("zerod.state-id.reset-", 0) == 0) ++backups;
  }
  EXPECT_EQ(backups, 3);
}

}  // namespace
}  // namespace zerod::server
