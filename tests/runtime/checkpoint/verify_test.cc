// A damaged checkpoint, as Verify and Restore see it: one flipped byte, a truncated file, a
// missing file, a missing manifest (a partial save). Each error names the file and the problem;
// Restore refuses before it loads anything damaged.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
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

// A format-1 manifest exactly as builds before the checksum wrote it: the body of ManifestToJson
// at commit 7b3b85a (main before format 2), copied here so that this test does not depend on how
// today's writer spells format 1; `tensor_steps`: with counters.tensor_steps, as main wrote it
// from commit d00aa93 on. nlohmann's json keeps keys sorted, so the text is determined.
std::string AsMainWroteIt(const Manifest& m, bool tensor_steps = false) {
  using nlohmann::json;
  auto hex = [](uint64_t h) { return absl::StrFormat("%016x", h); };
  json layout = json::array();
  for (const plan::TensorSpec& t : m.layout) {
    layout.push_back({{"name", t.name},
                      {"shape", t.shape},
                      {"dtype", std::string(DTypeName(t.dtype))},
                      {"unit", t.unit}});
  }
  json files = json::array();
  for (const RankFile& f : m.files) {
    json runs = json::array();
    for (const engine::ModelRun& r : f.runs) runs.push_back({r.offset, r.numel});
    json blocks = json::array();
    for (uint64_t h : f.block_xxh3) blocks.push_back(hex(h));
    files.push_back({{"rank", f.rank},
                     {"name", f.name},
                     {"runs", runs},
                     {"numel", f.numel},
                     {"extra_bytes", f.extra_bytes},
                     {"bytes", f.bytes},
                     {"xxh3", hex(f.xxh3)},
                     {"block_xxh3", blocks}});
  }
  json j = {{"format_version", 1},
            {"job_id", m.job_id},
            {"step", m.step},
            {"counters",
             {{"applied_steps", m.counters.applied_steps},
              {"steps_taken", m.counters.steps_taken},
              {"loss_scale", m.counters.loss_scaler.scale},
              {"clean_steps", m.counters.loss_scaler.clean_steps},
              {"hysteresis_left", m.counters.loss_scaler.hysteresis_left}}},
            {"world_size", m.world_size},
            {"stage", m.stage},
            {"param_dtype", std::string(DTypeName(m.param_dtype))},
            {"grad_dtype", std::string(DTypeName(m.grad_dtype))},
            {"layout", layout},
            {"layout_digest", m.layout_digest},
            {"plan_digest", m.plan_digest},
            {"total_numel", m.total_numel},
            {"files", files},
            {"created_unix_ms", m.created_unix_ms}};
  if (tensor_steps) j["counters"]["tensor_steps"] = m.counters.tensor_steps;
  j["user"] = m.user;
  return j.dump(1) + "\n";
}

// A manifest written before manifests had a checksum (format 1, as main wrote it) is refused,
// never read as if it had been checked: the message names the way to vouch for it (zeroctl
// checkpoint upgrade).
TEST_F(DamagedCheckpoint, AManifestThatPredatesTheChecksumIsRefusedNamingTheUpgrade) {
  const std::string manifest = dir_ + "/" + kManifestName;
  auto m = ReadManifest(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string legacy = AsMainWroteIt(*m);
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
  EXPECT_EQ(upgraded->created_unix_ms, m->created_unix_ms);
  EXPECT_TRUE(upgraded->recorded);
  EXPECT_TRUE(Verify(dir_).ok());
  // A damaged rank file is no checkpoint to vouch for.
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << legacy;
  fs::resize_file(File(1), fs::file_size(File(1)) - 1);
  absl::Status refused = UpgradeManifest(dir_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_EQ(ReadText(manifest), legacy) << "the legacy manifest was replaced";
}

// Format 1 as main wrote it once tensors had their own step counts: refused as any format 1, and
// upgraded with the counts kept.
TEST_F(DamagedCheckpoint, AFormat1ManifestWithTensorStepsIsUpgradedKeepingThem) {
  const std::string manifest = dir_ + "/" + kManifestName;
  auto m = ReadManifest(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_FALSE(m->counters.tensor_steps.empty());
  const std::string legacy = AsMainWroteIt(*m, /*tensor_steps=*/true);
  ASSERT_THAT(legacy, HasSubstr("\"tensor_steps\""));
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << legacy;
  EXPECT_EQ(ReadManifest(dir_).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(UpgradeManifest(dir_).ok()) << UpgradeManifest(dir_);
  auto upgraded = ReadManifest(dir_);
  ASSERT_TRUE(upgraded.ok()) << upgraded.status();
  EXPECT_EQ(upgraded->counters.tensor_steps, m->counters.tensor_steps);
  EXPECT_TRUE(Verify(dir_).ok());
}

// The review's case: a format-2 manifest edited (applied_steps) and relabelled format 1, still
// carrying its checksum field, is not a manifest written before the checksum: the upgrade refuses
// to bless it and leaves it as it was.
TEST_F(DamagedCheckpoint, AFormat2ManifestRelabelledFormat1IsNotUpgraded) {
  const std::string manifest = dir_ + "/" + kManifestName;
  std::string edited = ReadText(manifest);
  edited.replace(edited.find("\"format_version\": 2"), 19, "\"format_version\": 1");
  const size_t at = edited.find("\"applied_steps\": 2");
  ASSERT_NE(at, std::string::npos) << edited;
  edited.replace(at, 18, "\"applied_steps\": 1");
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << edited;
  const absl::Status refused = UpgradeManifest(dir_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_THAT(std::string(refused.message()), AllOf(HasSubstr(manifest), HasSubstr("relabelled")));
  EXPECT_EQ(ReadText(manifest), edited);
  EXPECT_FALSE(ReadManifest(dir_).ok());
}

}  // namespace
}  // namespace zerod::checkpoint
