// Which checkpoint a load takes from a root, and what it refuses, with real ranks and real files
// (save_job.h): links for step directories, directories named for another step, checkpoints this
// job never recorded, files a crashed world left behind, damaged checkpoints (a load falls back to
// the newest intact one and says which it skipped and why).

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/save_protocol.h"
#include "tests/runtime/checkpoint/save_job.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::FakeRecorder;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Options;
using testing::RunJob;
using testing::TempRoot;
using testing::TrainStep;

std::string Absolute(const std::string& root, int64_t step) {
  return StepDirectory(fs::absolute(root).string(), step);
}

// Flips one bit of `path` at `offset`.
void Flip(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  f.seekp(offset);
  c = static_cast<char>(c ^ 0x10);
  f.write(&c, 1);
}

// One character of a manifest's applied_steps, changed.
void EditAppliedSteps(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"applied_steps\": ");
  ASSERT_NE(at, std::string::npos);
  char& digit = text[at + 17];
  digit = digit == '0' ? '1' : '0';
  std::ofstream(path, std::ios::trunc) << text;
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    out.insert(entry.path().filename().string());
  }
  return out;
}

// Steps 1..`steps` saved by a world of 2 at stage 1, each step's master parameters in `saved`.
void SaveSteps(const std::string& root, int steps, Recorder* recorder,
               std::map<int64_t, std::vector<float>>* saved = nullptr) {
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 1; s <= steps; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      auto out = Save(e, store, r == 0 ? recorder : nullptr, Options(root));
      ASSERT_TRUE(out.ok()) << out.status();
      auto full = e.FullMasterParameters();
      ASSERT_TRUE(full.ok());
      if (r == 0 && saved != nullptr) (*saved)[s] = *full;
    }
  });
}

TEST(Selection, AStepDirectoryThatIsALinkIsRefusedByVerifyAndLoadAndSkippedInARoot) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  const std::string link = StepDirectory(root, 3);
  fs::create_directory_symlink(fs::absolute(StepDirectory(root, 1)), link);
  const absl::Status verify = Verify(link);
  EXPECT_EQ(verify.code(), absl::StatusCode::kFailedPrecondition) << verify;
  EXPECT_THAT(std::string(verify.message()), AllOf(HasSubstr(link), HasSubstr("symbolic link")));
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 2);
    auto named = Load(e, store, link, nullptr);
    ASSERT_FALSE(named.ok());
    EXPECT_THAT(std::string(named.status().message()), HasSubstr("symbolic link"));
  });
}

// A checkpoint copied under another step's name would resume at the wrong step in the data.
TEST(Selection, ADirectoryNamedForAnotherStepThanItsManifestSaysIsRefused) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  fs::copy(StepDirectory(root, 1), StepDirectory(root, 7), fs::copy_options::recursive);
  const absl::Status verify = Verify(StepDirectory(root, 7));
  EXPECT_FALSE(verify.ok());
  EXPECT_THAT(std::string(verify.message()),
              AllOf(HasSubstr("step-000000000007"), HasSubstr("step 1")));
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 2);
  });
}

// The case: a link planted for the step directory a save is about to make. The save is
// refused on every rank naming the link, nothing is written where it points, and keep_last still
// manages the job's own directories (and leaves the link alone).
TEST(Selection, ASaveNeverWritesThroughALinkPlantedForItsStepDirectory) {
  const std::string root = TempRoot();
  const std::string elsewhere = TempRoot();
  fs::create_directories(root);
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, StepDirectory(root, 2));
  FakeRecorder recorder;
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, r == 0 ? &recorder : nullptr, Options(root, 1)).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    auto refused = Save(e, store, r == 0 ? &recorder : nullptr, Options(root, 1));
    ASSERT_FALSE(refused.ok()) << "rank " << r;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                AllOf(HasSubstr(Absolute(root, 2)), HasSubstr("symbolic link")));
    ASSERT_TRUE(TrainStep(e, r).ok());
    auto third = Save(e, store, r == 0 ? &recorder : nullptr, Options(root, 1));
    ASSERT_TRUE(third.ok()) << third.status();
  });
  EXPECT_TRUE(Entries(elsewhere).empty()) << "written through the link";
  EXPECT_EQ(Entries(root), (std::set<std::string>{"step-000000000002", "step-000000000003"}));
  EXPECT_TRUE(fs::is_symlink(StepDirectory(root, 2)));
  bool step1_removed = false;
  for (const CheckpointRecordInfo& c : recorder.calls()) {
    step1_removed |= c.step == 1 && c.state == RecordState::kRemoved;
  }
  EXPECT_TRUE(step1_removed) << "keep_last did not remove the job's own step 1";
}

// The case: another job's checkpoint copied into this job's root at a higher step. No
// record lists it there (the job that saved it recorded it in its own root), so a load from the
// root does not take it; named on purpose (a new job starting from another's checkpoint), it loads.
TEST(Selection, ACheckpointThisJobNeverRecordedIsNotLoadedFromItsRoot) {
  const std::string mine = TempRoot();
  const std::string theirs = TempRoot();
  FakeRecorder recorder("test");
  FakeRecorder other("other");
  recorder.SeesRecordsOf(&other);
  std::map<int64_t, std::vector<float>> saved;
  SaveSteps(mine, 1, &recorder, &saved);
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(TrainStep(e, r).ok());
    SaveOptions o = Options(theirs);
    o.job_id = "other";
    ASSERT_TRUE(Save(e, store, r == 0 ? &other : nullptr, o).ok());
  });
  fs::copy(StepDirectory(theirs, 3), StepDirectory(mine, 3), fs::copy_options::recursive);
  ::testing::internal::CaptureStderr();
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, mine, r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 1);
    EXPECT_EQ(*e.FullMasterParameters(), saved[1]);
    auto resumed = LoadNewestIfAny(e, store, {mine}, r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    ASSERT_TRUE(resumed->has_value());
    EXPECT_EQ((*resumed)->step, 1);
    auto named = Load(e, store, StepDirectory(mine, 3), r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(named->step, 3);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr(Absolute(mine, 3) +
                             " (not in job test's records: saved by job other, which did not "
                             "record it complete here (copied in?))"));
  auto latest = LatestComplete(mine, &recorder);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, Absolute(mine, 1));
}

// A later job resuming from the root an earlier job saved into (a script run again under a new
// job id): the earlier job's records list the checkpoint there, with that manifest, so it counts.
// Its manifest replaced by another consistent one, it does not.
TEST(Selection, ACheckpointAnotherJobSavedInThisRootIsLoadedByThatJobsRecords) {
  const std::string root = TempRoot();
  FakeRecorder earlier("earlier");
  FakeRecorder later("test");
  later.SeesRecordsOf(&earlier);
  std::map<int64_t, std::vector<float>> saved;
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 1; s <= 2; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      SaveOptions o = Options(root);
      o.job_id = "earlier";
      ASSERT_TRUE(Save(e, store, r == 0 ? &earlier : nullptr, o).ok());
      auto full = e.FullMasterParameters();
      if (r == 0) saved[s] = *full;
    }
  });
  RunJob(2, 3, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, r == 0 ? &later : nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 2);
    EXPECT_EQ(*e.FullMasterParameters(), saved[2]);
  });
  // Step 2's manifest rewritten consistently (checksum and all) with another user string: not
  // the manifest job "earlier" recorded, so step 1 is taken.
  auto m = ReadManifest(StepDirectory(root, 2));
  ASSERT_TRUE(m.ok()) << m.status();
  m->user = "forged";
  ASSERT_TRUE(WriteManifest(StepDirectory(root, 2), *m).ok());
  ASSERT_TRUE(Verify(StepDirectory(root, 2)).ok());
  ::testing::internal::CaptureStderr();
  RunJob(2, 3, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, r == 0 ? &later : nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 1);
  });
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("its manifest is not the one job earlier recorded here"));
}

// This job's own checkpoint, its manifest rewritten consistently after the save (a forgery the
// manifest's checksum alone cannot catch): the record keeps the checksum of the manifest the job
// completed, so the load sets it aside and takes the one before.
TEST(Selection, AManifestReplacedAfterItsSaveIsNotTheOneTheJobRecorded) {
  const std::string root = TempRoot();
  FakeRecorder recorder;
  SaveSteps(root, 2, &recorder);
  auto m = ReadManifest(StepDirectory(root, 2));
  ASSERT_TRUE(m.ok()) << m.status();
  m->counters.applied_steps = 1;
  ASSERT_TRUE(WriteManifest(StepDirectory(root, 2), *m).ok());
  ::testing::internal::CaptureStderr();
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 1);
  });
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              AllOf(HasSubstr("is not the manifest job test recorded complete"),
                    HasSubstr("set aside as " + Absolute(root, 2) + ".damaged-")));
}

// In-memory snapshots are not recorded: this job's are taken, another job's are not.
TEST(Selection, AnUnrecordedSnapshotOfThisJobIsLoadedAndOneOfAnotherJobIsNot) {
  const std::string durable = TempRoot();
  const std::string snapshots = TempRoot();
  const std::string foreign = TempRoot();
  FakeRecorder recorder("test");
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, r == 0 ? &recorder : nullptr, Options(durable)).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    SaveOptions o = Options(snapshots);
    o.record = false;
    ASSERT_TRUE(Save(e, store, r == 0 ? &recorder : nullptr, o).ok());
  });
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(TrainStep(e, r).ok());
    SaveOptions o = Options(foreign);
    o.record = false;
    o.job_id = "other";
    ASSERT_TRUE(Save(e, store, nullptr, o).ok());
  });
  fs::copy(StepDirectory(foreign, 3), StepDirectory(snapshots, 3), fs::copy_options::recursive);
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto resumed = LoadNewestIfAny(e, store, {snapshots, durable}, r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    ASSERT_TRUE(resumed->has_value());
    EXPECT_EQ((*resumed)->step, 2);
    EXPECT_EQ((*resumed)->directory, Absolute(snapshots, 2));
  });
}

// The case: a world of 3 died saving step 2 (rank files, no manifest); a world of 2 saves
// step 2 again. The dead world's rank 2 file is not kept beside the new ones, and a file the
// manifest does not list, put there afterwards, is flagged by Verify and refused by Load.
TEST(Selection, ASaveOfAStepACrashedLargerWorldLeftPartialKeepsNoneOfItsFiles) {
  const std::string root = TempRoot();
  RunJob(1, 3, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, nullptr, Options(root)).ok());
  });
  const std::string dir = StepDirectory(root, 2);
  fs::remove(dir + "/" + kManifestName);
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(TrainStep(e, r).ok());
    auto out = Save(e, store, nullptr, Options(root));
    ASSERT_TRUE(out.ok()) << out.status();
  });
  EXPECT_EQ(Entries(dir), (std::set<std::string>{kManifestName, RankFileName(0), RankFileName(1)}));
  EXPECT_TRUE(Verify(dir).ok()) << Verify(dir);

  fs::copy_file(dir + "/" + RankFileName(1), dir + "/" + RankFileName(2));
  const absl::Status verify = Verify(dir);
  EXPECT_FALSE(verify.ok());
  EXPECT_THAT(std::string(verify.message()),
              AllOf(HasSubstr(dir + "/" + RankFileName(2)), HasSubstr("not listed")));
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto named = Load(e, store, dir, nullptr);
    ASSERT_FALSE(named.ok());
    EXPECT_THAT(std::string(named.status().message()), HasSubstr(RankFileName(2)));
  });
}

// The case for elastic runs: the newest checkpoint is damaged (a rank file's byte), the
// one before it too (its manifest's applied_steps edited). A load from the root falls back to the
// newest intact one on every rank, says which it skipped and why, and the run saves on.
TEST(Selection, ADamagedNewestCheckpointIsSkippedForTheNewestIntactOneSayingWhy) {
  const std::string root = TempRoot();
  FakeRecorder recorder;
  std::map<int64_t, std::vector<float>> saved;
  SaveSteps(root, 3, &recorder, &saved);
  Flip(StepDirectory(root, 3) + "/" + RankFileName(1), 20);
  EditAppliedSteps(StepDirectory(root, 2));
  ::testing::internal::CaptureStderr();
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = LoadIfAny(e, store, root, r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(loaded.ok()) << "rank " << r << ": " << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_EQ((*loaded)->step, 1);
    EXPECT_EQ(e.step(), 1);
    EXPECT_EQ(*e.FullMasterParameters(), saved[1]);
    // Training on from step 1 saves steps 2 and 3 again.
    for (int s = 2; s <= 3; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      auto out = Save(e, store, r == 0 ? &recorder : nullptr, Options(root));
      ASSERT_TRUE(out.ok()) << "rank " << r << ": " << out.status();
    }
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, AllOf(HasSubstr(Absolute(root, 3)), HasSubstr("checksum mismatch"),
                         HasSubstr(Absolute(root, 2)), HasSubstr("manifest")));
  EXPECT_TRUE(Verify(StepDirectory(root, 3)).ok());
  EXPECT_TRUE(Verify(StepDirectory(root, 2)).ok());
  // The damaged ones were set aside for the operator, not deleted.
  int set_aside = 0;
  for (const std::string& name : Entries(root)) set_aside += name.find(".damaged") != name.npos;
  EXPECT_EQ(set_aside, 2);
}

// Nothing intact to fall back to: an error naming every damaged checkpoint, never a fresh start.
TEST(Selection, WhenEveryCheckpointIsDamagedLoadFailsNamingEach) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  Flip(StepDirectory(root, 2) + "/" + RankFileName(0), 4);
  fs::remove(StepDirectory(root, 1) + "/" + RankFileName(1));
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = LoadIfAny(e, store, root, nullptr);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()),
                AllOf(HasSubstr("step-000000000002"), HasSubstr("step-000000000001"),
                      HasSubstr("no intact checkpoint")));
  });
}

// train_mlp --resume and zt.resume go through LoadNewestIfAny: a partial newest checkpoint it
// skips is named on stderr.
TEST(Selection, ResumeSaysWhichNewerPartialCheckpointItSkipped) {
  const std::string root = TempRoot();
  SaveSteps(root, 1, nullptr);
  fs::create_directories(StepDirectory(root, 2));
  fs::copy_file(StepDirectory(root, 1) + "/" + RankFileName(0),
                StepDirectory(root, 2) + "/" + RankFileName(0));
  ::testing::internal::CaptureStderr();
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto resumed = LoadNewestIfAny(e, store, {root}, nullptr);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    ASSERT_TRUE(resumed->has_value());
    EXPECT_EQ((*resumed)->step, 1);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(
      err, AllOf(HasSubstr("skipp"), HasSubstr(Absolute(root, 2)), HasSubstr("no manifest.json")));
  const size_t skipped = err.find("skipped");
  ASSERT_NE(skipped, std::string::npos);
  EXPECT_THAT(err.substr(skipped), Not(HasSubstr(Absolute(root, 1)))) << "the loaded one is listed";
}

}  // namespace
}  // namespace zerod::checkpoint
