// Which checkpoint a load takes from a root without a coordinator, and what it refuses, with real
// ranks and real files (save_job.h): links for step directories, directories named for another
// step, files a crashed world left behind, files the manifest does not list, damaged checkpoints
// (a load falls back to the newest intact one and says which it skipped and why), and failures
// that are not damage (a rank that cannot see the directory, or reads another copy of it, a store
// error), which end the load and set nothing aside. Selection by the coordinator's records is
// tested against a real zerod: tests/integration/checkpoint_selection_test.cc.

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/save_protocol.h"
#include "tests/runtime/checkpoint/save_job.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_time.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Options;
using testing::RunJob;
using testing::TempRoot;
using testing::TrainStep;
using zerod::testing::FlipBit;
using zerod::testing::Scaled;

std::string Absolute(const std::string& root, int64_t step) {
  return StepDirectory(fs::absolute(root).string(), step);
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
  std::map<int64_t, std::vector<float>> saved;
  SaveSteps(root, 3, nullptr, &saved);
  FlipBit(StepDirectory(root, 3) + "/" + RankFileName(1), 20);
  EditAppliedSteps(StepDirectory(root, 2));
  ::testing::internal::CaptureStderr();
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    // Rank 1 alone reads step 3's damaged block (stage 2, the same world): rank 0 finds the
    // damage itself by checking the whole checkpoint before it sets it aside.
    auto loaded = LoadIfAny(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << "rank " << r << ": " << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_EQ((*loaded)->step, 1);
    EXPECT_EQ(e.step(), 1);
    EXPECT_EQ(*e.FullMasterParameters(), saved[1]);
    // Training on from step 1 saves steps 2 and 3 again.
    for (int s = 2; s <= 3; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      auto out = Save(e, store, nullptr, Options(root));
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
  FlipBit(StepDirectory(root, 2) + "/" + RankFileName(0), 4);
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
    auto resumed = LoadNewestIfAny(e, store, {"", {root}}, nullptr);
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

// Failure injection: the job's store, except that every Get of a key ending in `suffix` fails
// NOT_FOUND, on every rank alike (a store error, which is no damage of the checkpoint).
class FailingGetStore final : public comm::Store {
 public:
  FailingGetStore(comm::Store& inner, std::string suffix)
      : inner_(inner), suffix_(std::move(suffix)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (absl::EndsWith(key, suffix_)) {
      return absl::NotFoundError(absl::StrCat("failure injection: store key ", key, " is gone"));
    }
    return inner_.Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_.Add(key, delta);
  }
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired) override {
    return inner_.CompareSet(key, expected, desired);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override { return inner_.Delete(key); }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return inner_.Wait(keys, timeout);
  }

 private:
  comm::Store& inner_;
  const std::string suffix_;
};

// Failure injection for the views below: what rank 1 reads instead of rank 0's choice.
std::string rank1_view;  // NOLINT: set before each load, read by the ranks' threads after
std::string Rank1Sees(int64_t rank, const std::string& dir) {
  return rank == 1 ? rank1_view + "/" + fs::path(dir).filename().string() : dir;
}

// Restores the default view when a test ends.
struct ViewInjection {
  explicit ViewInjection(const std::string& view) {
    rank1_view = view;
    SetLoadViewInjectionForTesting(&Rank1Sees);
  }
  ~ViewInjection() { SetLoadViewInjectionForTesting(nullptr); }
};

// The review's case: rank 1's node lacks the shared filesystem. That is no damage: the load fails
// on every rank naming the rank and the directory, and every checkpoint stays where it is; once
// the filesystem is there, the newest loads.
TEST(Selection, ARankThatCannotSeeTheCheckpointFailsTheLoadAndSetsNothingAside) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  const std::set<std::string> before = Entries(root);
  {
    ViewInjection unmounted(root + "-not-mounted-on-rank-1");
    RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
      auto loaded = LoadIfAny(e, store, root, nullptr);
      ASSERT_FALSE(loaded.ok()) << "rank " << r;
      EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound) << loaded.status();
      EXPECT_THAT(std::string(loaded.status().message()),
                  AllOf(HasSubstr("rank 1"), HasSubstr("does not exist")));
    });
  }
  EXPECT_EQ(Entries(root), before) << "a checkpoint was set aside";
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = LoadIfAny(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_EQ((*loaded)->step, 2);
  });
}

// Rank 1 reads a damaged copy (a stale cache on its node, or its own bad memory) where rank 0 reads
// the checkpoint intact: rank 0 checks it, does not set it aside, and the load fails saying so.
TEST(Selection, DamageOnlyAnotherRankSeesIsNotSetAside) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  const std::string copy = TempRoot();
  fs::create_directories(copy);
  fs::copy(StepDirectory(root, 2), StepDirectory(copy, 2), fs::copy_options::recursive);
  FlipBit(StepDirectory(copy, 2) + "/" + RankFileName(1), 20);
  const std::set<std::string> before = Entries(root);
  {
    ViewInjection stale(copy);
    // Stage 2, the saving world: rank 1 reads rank 1's file, rank 0 never does.
    RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
      auto loaded = LoadIfAny(e, store, root, nullptr);
      ASSERT_FALSE(loaded.ok()) << "rank " << r;
      EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
      EXPECT_THAT(std::string(loaded.status().message()),
                  AllOf(HasSubstr("rank 1"), HasSubstr("checksum mismatch"),
                        HasSubstr("rank 0 reads " + Absolute(root, 2) + " intact")));
    });
  }
  EXPECT_EQ(Entries(root), before) << "a checkpoint was set aside";
  EXPECT_TRUE(Verify(StepDirectory(root, 2)).ok());
}

// A store error while the ranks agree (NOT_FOUND, as the coordinator's store answers for a key
// that is gone) is no damage of the checkpoint: the load fails on every rank, nothing set aside.
TEST(Selection, AStoreErrorDuringALoadSetsNothingAside) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  const std::set<std::string> before = Entries(root);
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    FailingGetStore failing(store, "/read/1");
    auto loaded = LoadIfAny(e, failing, root, nullptr, Scaled(absl::Minutes(5)));
    ASSERT_FALSE(loaded.ok()) << "rank " << r;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound) << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("failure injection"));
  });
  EXPECT_EQ(Entries(root), before) << "a checkpoint was set aside";
}

// The review's case: a file the manifest does not list (here an export written into the step
// directory) does not make a complete checkpoint damaged. A load from the root refuses it naming
// the file, sets nothing aside and takes no older one; moved out, the checkpoint loads. What an
// interrupted manifest rewrite leaves (manifest.json.XXXXXX.tmp) is not read and not refused.
TEST(Selection, AFileTheManifestDoesNotListIsRefusedNamingItAndNothingIsSetAside) {
  const std::string root = TempRoot();
  SaveSteps(root, 2, nullptr);
  const std::string dir = StepDirectory(root, 2);
  const std::string stray = dir + "/model.safetensors";
  ASSERT_TRUE(ExportSafetensors(dir, stray).ok());
  const std::set<std::string> before = Entries(root);
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = LoadIfAny(e, store, root, nullptr);
    ASSERT_FALSE(loaded.ok()) << "rank " << r;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition) << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()),
                AllOf(HasSubstr(Absolute(root, 2) + "/model.safetensors"),
                      HasSubstr("not listed in its manifest")));
  });
  EXPECT_EQ(Entries(root), before) << "a checkpoint was set aside";
  fs::rename(stray, root + "-model.safetensors");
  std::ofstream(dir + "/" + kManifestName + ".Ab12Cd.tmp") << "{";
  RunJob(1, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = LoadIfAny(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_EQ((*loaded)->step, 2);
  });
}

// Nothing to load, but something was skipped: the load says what and why (no silent fresh start).
TEST(Selection, WhenNothingLoadsTheLoadSaysWhatItSkippedAndWhy) {
  const std::string root = TempRoot();
  fs::create_directories(StepDirectory(root, 4));
  std::ofstream(StepDirectory(root, 4) + "/" + RankFileName(0)) << "half";
  ::testing::internal::CaptureStderr();
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = LoadIfAny(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << "rank " << r << ": " << loaded.status();
    EXPECT_FALSE(loaded->has_value());
  });
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              AllOf(HasSubstr("nothing to load"), HasSubstr(Absolute(root, 4)),
                    HasSubstr("no manifest.json")));
}

// A hard link left in a partial step directory (to a file outside it) is emptied away with the
// directory's other leftovers: the save writes new files and the linked file keeps its bytes.
TEST(Selection, ASaveNeverWritesThroughAHardLinkLeftInItsStepDirectory) {
  const std::string root = TempRoot();
  fs::create_directories(StepDirectory(root, 1));
  const std::string victim = root + "/../victim";
  std::ofstream(victim) << "keep me";
  fs::create_hard_link(victim, StepDirectory(root, 1) + "/" + RankFileName(0));
  SaveSteps(root, 1, nullptr);
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
            "keep me");
  EXPECT_TRUE(Verify(StepDirectory(root, 1)).ok()) << Verify(StepDirectory(root, 1));
}

}  // namespace
}  // namespace zerod::checkpoint
