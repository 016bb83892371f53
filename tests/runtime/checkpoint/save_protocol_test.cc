// The save and load protocol (save_protocol.h) with real ranks (save_job.h): threads with their
// own Gloo communicators over loopback, one InMemoryStore as the job's store, real files in a
// temporary directory. FailureInjectingRecorder stands in for the coordinator's records where a
// test injects a failure (a record that fails, a crash between manifest and record).

#include "runtime/checkpoint/save_protocol.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/checkpoint/save_job.h"
#include "tests/util/test_time.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::FailureInjectingRecorder;
using ::testing::HasSubstr;
using testing::Options;
using testing::RunJob;
using testing::TempRoot;
using testing::TrainStep;
using ::zerod::testing::Scaled;

TEST(SaveProtocol, SaveWritesACheckpointThatLoadsAtAnotherWorldSizeAndStage) {
  const std::string root = TempRoot();
  std::vector<float> saved;
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(TrainStep(e, r).ok());
    SaveOptions o = Options(root);
    o.user = R"({"epoch": 3})";
    o.extra = absl::StrCat("buffers of rank ", r);
    auto out = Save(e, store, nullptr, o);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->step, 2);
    EXPECT_EQ(out->directory, StepDirectory(fs::absolute(root).string(), 2));
    EXPECT_GT(out->bytes, 0);
    auto full = e.FullMasterParameters();
    ASSERT_TRUE(full.ok());
    if (r == 0) saved = *full;
  });
  ASSERT_TRUE(fs::exists(fs::path(StepDirectory(root, 2)) / kManifestName));
  for (auto [stage_value, world_value] : {std::pair{1, 3}, std::pair{3, 1}}) {
    const int stage = stage_value;  // clang 14 lambdas cannot capture structured bindings
    const int64_t world = world_value;
    RunJob(stage, world, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
      auto loaded = Load(e, store, root, nullptr);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->step, 2);
      EXPECT_EQ(e.step(), 2);
      EXPECT_EQ(loaded->manifest.user, R"({"epoch": 3})");
      // A rank the saving world had takes its own bytes, a new one rank 0's.
      EXPECT_EQ(loaded->extra, absl::StrCat("buffers of rank ", r < 2 ? r : 0));
      auto full = e.FullMasterParameters();
      ASSERT_TRUE(full.ok());
      EXPECT_EQ(*full, saved) << "stage " << stage << " world " << world;
    });
  }
}

TEST(SaveProtocol, KeepLastRemovesOldCheckpointsOnlyAfterTheNewOneIsComplete) {
  const std::string root = TempRoot();
  FailureInjectingRecorder recorder;
  // Step 1: a save of this job that crashed (recorded saving, no manifest). Step 0: a partial
  // directory this job has no record of: another job sharing the root, still writing. Step 99:
  // newer. A link named like a step, pointing at a checkpoint kept elsewhere.
  fs::create_directories(StepDirectory(root, 0));
  std::ofstream(fs::path(StepDirectory(root, 0)) / RankFileName(0)) << "half";
  fs::create_directories(StepDirectory(root, 1));
  std::ofstream(fs::path(StepDirectory(root, 1)) / RankFileName(0)) << "half";
  recorder.MarkSaving(StepDirectory(fs::absolute(root).string(), 1));
  fs::create_directories(StepDirectory(root, 99));
  const std::string elsewhere = TempRoot();
  fs::create_directories(elsewhere);
  std::ofstream(fs::path(elsewhere) / kManifestName) << "{}";
  fs::create_directory_symlink(elsewhere, StepDirectory(root, 5));
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());  // saves at steps 2, 3, 4
    for (int s = 2; s <= 4; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      auto out = Save(e, store, r == 0 ? &recorder : nullptr, Options(root, 2));
      ASSERT_TRUE(out.ok()) << out.status();
    }
  });
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(root)) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left,
            (std::vector<std::string>{"step-000000000000", "step-000000000003", "step-000000000004",
                                      "step-000000000005", "step-000000000099"}));
  EXPECT_TRUE(fs::exists(fs::path(elsewhere) / kManifestName)) << "removed through a link";
  // Step 2 was recorded removed only after step 4 was recorded complete.
  const std::vector<CheckpointRecordInfo> calls = recorder.calls();
  auto index_of = [&](int64_t step, RecordState state) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].step == step && calls[i].state == state) return static_cast<int64_t>(i);
    }
    return int64_t{-1};
  };
  ASSERT_GE(index_of(2, RecordState::kRemoved), 0);
  EXPECT_GT(index_of(2, RecordState::kRemoved), index_of(4, RecordState::kComplete));
  EXPECT_LT(index_of(4, RecordState::kSaving), index_of(4, RecordState::kComplete));
  EXPECT_GE(index_of(1, RecordState::kRemoved), 0) << "this job's crashed save stays";
  EXPECT_EQ(index_of(3, RecordState::kRemoved), -1);
}

// The manifest is written but the coordinator cannot record the checkpoint complete: the save
// fails everywhere and takes its manifest back, so no reader counts complete what the record
// says is saving; the previous checkpoint is still the newest complete one.
TEST(SaveProtocol, ACheckpointTheCoordinatorCannotRecordCompleteIsNotLeftLookingComplete) {
  const std::string root = TempRoot();
  FailureInjectingRecorder recorder;
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, r == 0 ? &recorder : nullptr, Options(root)).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    if (r == 0) recorder.FailNextComplete();
    auto out = Save(e, store, r == 0 ? &recorder : nullptr, Options(root));
    ASSERT_FALSE(out.ok()) << "rank " << r;
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("the coordinator is gone"));
  });
  EXPECT_FALSE(fs::exists(fs::path(StepDirectory(root, 2)) / kManifestName));
  for (Recorder* with : {static_cast<Recorder*>(&recorder), static_cast<Recorder*>(nullptr)}) {
    auto latest = LatestComplete(root, with);
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(*latest, StepDirectory(fs::absolute(root).string(), 1));
  }
}

// A job that saves every step keeps a few keys in its store, not world + 2 per save: each call's
// keys go once every rank has reached the next call.
TEST(SaveProtocol, SavesAndLoadsLeaveOnlyTheLastCallsKeysInTheStore) {
  const std::string root = TempRoot();
  std::vector<std::string> probes;
  RunJob(2, 3, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 1; s <= 4; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      ASSERT_TRUE(Save(e, store, nullptr, Options(root, 2)).ok());
    }
    ASSERT_TRUE(LoadIfAny(e, store, root, nullptr).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, nullptr, Options(root, 2)).ok());
    if (r != 0) return;
    // Calls 1-4 saved steps 1-4, call 5 loaded step 4, call 6 saved step 5.
    for (const char* gone : {"ckpt/1/1/start", "ckpt/3/3/rank/2", "ckpt/4/4/done", "ckpt/load/5",
                             "ckpt/load/5/rank/1", "ckpt/keys/4"}) {
      EXPECT_FALSE(store.Get(gone, absl::ZeroDuration()).ok()) << gone << " was left";
    }
    EXPECT_TRUE(store.Get("ckpt/5/6/done", absl::ZeroDuration()).ok());
  });
}

// A slow disk is no timeout: each rank waits for the others from the end of its own write, so
// files that take longer to write than the timeout still make a checkpoint. Both scaled: the
// ranks' writes end a slow build's moment apart.
absl::Status SlowDisk(const std::string&, int64_t) {
  absl::SleepFor(Scaled(absl::Milliseconds(1500)));
  return absl::OkStatus();
}

// Failure injection: rank 1's disk fails in the middle of its file.
absl::Status RankOneDiskFails(const std::string& path, int64_t) {
  if (path.find(RankFileName(1)) == std::string::npos) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(path, ": write failed: Input/output error (injected)"));
}

TEST(SaveProtocol, FilesThatTakeLongerToWriteThanTheTimeoutStillMakeACheckpoint) {
  const std::string root = TempRoot();
  SetSaveFailureInjectionForTesting(&SlowDisk);
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    SaveOptions o = Options(root);
    o.timeout = Scaled(absl::Seconds(1));
    auto out = Save(e, store, nullptr, o);
    EXPECT_TRUE(out.ok()) << "rank " << r << ": " << out.status();
  });
  SetSaveFailureInjectionForTesting(nullptr);
  EXPECT_TRUE(fs::exists(fs::path(StepDirectory(root, 1)) / kManifestName));
}

TEST(SaveProtocol, ARankThatFailsToWriteMakesSaveFailOnEveryRankQuickly) {
  const std::string root = TempRoot();
  RunJob(2, 3, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, nullptr, Options(root)).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
  });
  SetSaveFailureInjectionForTesting(&RankOneDiskFails);
  RunJob(2, 3, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    const absl::Time start = absl::Now();
    auto out = Save(e, store, nullptr, Options(root));  // a 5-minute timeout (scaled)
    EXPECT_LT(absl::Now() - start, Scaled(absl::Minutes(2)))
        << "rank " << r << " waited for the timeout";
    ASSERT_FALSE(out.ok()) << "rank " << r;
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("rank 1")) << out.status();
  });
  SetSaveFailureInjectionForTesting(nullptr);
  EXPECT_FALSE(fs::exists(fs::path(StepDirectory(root, 2)) / kManifestName));
  for (const auto& entry : fs::directory_iterator(StepDirectory(root, 2))) {
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << ": the failed write left it";
  }
  // The previous checkpoint is untouched and still what a load takes.
  auto latest = LatestComplete(root, nullptr);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, StepDirectory(fs::absolute(root).string(), 1));
}

// A damaged block that only one rank reads: that rank fails its read, and every rank learns it
// before the all-gather that rebuilds the parameters (stage 2), instead of waiting in it for the
// collective timeout.
TEST(SaveProtocol, ADamagedFileOneRankReadsFailsTheLoadOnEveryRankQuicklyNamingTheFile) {
  const std::string root = TempRoot();
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, nullptr, Options(root)).ok());
  });
  const fs::path damaged = fs::path(StepDirectory(root, 1)) / RankFileName(1);
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('\x5a');
  }
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    const absl::Time start = absl::Now();
    // Rank 1 of the same world reads exactly rank 1's old file; rank 0 never reads it.
    auto loaded = Load(e, store, root, nullptr, Scaled(absl::Minutes(5)));
    EXPECT_LT(absl::Now() - start, Scaled(absl::Minutes(1)))
        << "rank " << r << " waited for a timeout";
    ASSERT_FALSE(loaded.ok()) << "rank " << r;
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(RankFileName(1)))
        << loaded.status();
  });
}

TEST(SaveProtocol, LoadPicksTheNewestCompleteAndSkipsAPartialOne) {
  const std::string root = TempRoot();
  std::map<int64_t, std::vector<float>> saved;
  RunJob(1, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 1; s <= 2; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      ASSERT_TRUE(Save(e, store, nullptr, Options(root)).ok());
      auto full = e.FullMasterParameters();
      if (r == 0) saved[s] = *full;
    }
    ASSERT_TRUE(TrainStep(e, r).ok());
  });
  // Step 3: rank files, no manifest (a save that died before completing).
  fs::create_directories(StepDirectory(root, 3));
  fs::copy_file(fs::path(StepDirectory(root, 2)) / RankFileName(0),
                fs::path(StepDirectory(root, 3)) / RankFileName(0));
  RunJob(2, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 2);
    EXPECT_EQ(*e.FullMasterParameters(), saved[2]);
    // Named, the partial one is an error, never loaded.
    auto partial = Load(e, store, StepDirectory(root, 3), nullptr);
    ASSERT_FALSE(partial.ok());
    EXPECT_THAT(std::string(partial.status().message()), HasSubstr("partial"));
    EXPECT_EQ(*e.FullMasterParameters(), saved[2]);
  });
}

TEST(SaveProtocol, LoadWithARecorderSkipsADirectoryWhoseRecordIsNotComplete) {
  const std::string root = TempRoot();
  FailureInjectingRecorder recorder;
  std::map<int64_t, std::vector<float>> saved;
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    for (int s = 1; s <= 2; ++s) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      ASSERT_TRUE(Save(e, store, r == 0 ? &recorder : nullptr, Options(root)).ok());
      auto full = e.FullMasterParameters();
      if (r == 0) saved[s] = *full;
    }
  });
  // Step 2 has its manifest, but the coordinator never heard that it completed.
  recorder.MarkSaving(StepDirectory(fs::absolute(root).string(), 2));
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    auto loaded = Load(e, store, root, r == 0 ? &recorder : nullptr);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 1);
    EXPECT_EQ(*e.FullMasterParameters(), saved[1]);
  });
  // Without the coordinator's word, the manifest alone makes step 2 complete.
  auto latest = LatestComplete(root, nullptr);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, StepDirectory(fs::absolute(root).string(), 2));
}

TEST(SaveProtocol, LoadIfAnyFindsNothingOnEveryRankWhereNothingWasSaved) {
  const std::string root = TempRoot();
  RunJob(2, 2, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    auto none = LoadIfAny(e, store, root, nullptr);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_FALSE(none->has_value());
    auto loaded = Load(e, store, root, nullptr);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("no complete checkpoint"));
  });
}

TEST(SaveProtocol, ASecondSaveOfACompleteStepIsRefusedOnEveryRankAndChangesNothing) {
  const std::string root = TempRoot();
  RunJob(2, 2, [&](int64_t r, engine::ZeroEngine& e, comm::Store& store) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(Save(e, store, nullptr, Options(root)).ok());
    auto again = Save(e, store, nullptr, Options(root));
    EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
    EXPECT_THAT(std::string(again.status().message()), HasSubstr("already saved"));
  });
  EXPECT_TRUE(Verify(StepDirectory(root, 1)).ok());
}

TEST(SaveProtocol, BadOptionsAreRefusedNamingTheOption) {
  RunJob(0, 1, [&](int64_t, engine::ZeroEngine& e, comm::Store& store) {
    SaveOptions o = Options(TempRoot(), -1);
    auto out = Save(e, store, nullptr, o);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("keep_last"));
  });
}

}  // namespace
}  // namespace zerod::checkpoint
