// Which checkpoint a load takes, by the job's own records, against the real zerod: ranks as
// threads with their own TrainerSessions (real gRPC, the coordinator's store and checkpoint
// records, real Gloo, real files). Another job's records never vouch for a directory; an
// unrecorded snapshot counts in the snapshot directory alone; a failure that is not damage (a
// rank that cannot see the directory, a file the manifest does not list) ends the load and leaves
// every checkpoint and record as it was; damage rank 0 finds is set aside (recorded so, and the
// step saved again, or the directory put back); the job's own checkpoints are never passed over
// in silence, nor the run started afresh over them. The one failure injected here is what a
// rank's node sees of the shared filesystem (SetLoadViewInjectionForTesting).

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/trainer_session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/save_protocol.h"
#include "runtime/common/status_macros.h"
#include "tests/integration/zerod_harness.h"
#include "tests/runtime/checkpoint/save_job.h"
#include "tests/util/test_time.h"

namespace zerod::testing {
namespace {

namespace fs = std::filesystem;
using checkpoint::LoadedCheckpoint;
using checkpoint::ResumeRoots;
using checkpoint::StepDirectory;
using checkpoint::testing::JobLayout;
using checkpoint::testing::TrainStep;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::zerod::testing::Scaled;

constexpr int64_t kWorld = 2;
// Stage 2 at world 2: each rank reads its own old rank file alone, so damage in rank 1's file is
// found by rank 1, and rank 0 must check it itself before setting anything aside.
constexpr int kStage = 2;

client::SessionOptions SessionOf(const ZerodHarness& zerod, const std::string& job, int64_t rank) {
  client::SessionOptions o;
  o.endpoint = zerod.endpoint();
  o.job_id = job;
  o.rank = rank;
  o.world_size = kWorld;
  o.layout = JobLayout();
  o.plan_options.stage = kStage;
  o.plan_options.param_dtype = DType::kFloat32;
  o.plan_options.grad_dtype = DType::kFloat32;
  o.heartbeat_interval = absl::Milliseconds(100);
  o.join_timeout = Scaled(absl::Seconds(60));
  o.collective_timeout = Scaled(absl::Seconds(60));
  return o;
}

using Body = std::function<void(int64_t rank, client::TrainerSession&, engine::ZeroEngine&)>;

// One world of job `job`: every rank a thread with its own session and engine (parameters
// initialised alike), running `body`, then leaving (the job ends; the next world forms it again,
// its checkpoint records kept).
void RunWorld(ZerodHarness& zerod, const std::string& job, const Body& body) {
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      auto session = client::TrainerSession::Start(SessionOf(zerod, job, r));
      ASSERT_TRUE(session.ok()) << "rank " << r << ": " << session.status();
      engine::EngineOptions options;
      options.adam.lr = 0.01;
      auto e = (*session)->CreateEngine(options);
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(checkpoint::testing::InitJobParameters(**e).ok());
      body(r, **session, **e);
      EXPECT_TRUE((*session)->Leave().ok());
    });
  }
  for (std::thread& t : ranks) t.join();
}

// Steps 1..`steps` of job `job`, each saved into `root`.
void SaveSteps(ZerodHarness& zerod, const std::string& job, const std::string& root, int steps) {
  RunWorld(zerod, job, [&](int64_t r, client::TrainerSession& s, engine::ZeroEngine& e) {
    for (int step = 1; step <= steps; ++step) {
      ASSERT_TRUE(TrainStep(e, r).ok());
      checkpoint::SaveOptions o;
      o.root = root;
      auto saved = s.SaveCheckpoint(o);
      ASSERT_TRUE(saved.ok()) << "rank " << r << ": " << saved.status();
    }
  });
}

// What every rank of a world of `job` got from `load`; the first rank's stderr-free result.
using Load =
    std::function<absl::StatusOr<std::optional<LoadedCheckpoint>>(client::TrainerSession&)>;
std::vector<absl::StatusOr<std::optional<LoadedCheckpoint>>> LoadOnEveryRank(ZerodHarness& zerod,
                                                                             const std::string& job,
                                                                             const Load& load) {
  std::vector<absl::StatusOr<std::optional<LoadedCheckpoint>>> out(kWorld,
                                                                   absl::UnknownError("not run"));
  RunWorld(zerod, job, [&](int64_t r, client::TrainerSession& s, engine::ZeroEngine&) {
    out[static_cast<size_t>(r)] = load(s);
  });
  return out;
}

// The step every rank loaded (-1: none), failing the test when a rank's load failed.
int64_t LoadedStep(const std::vector<absl::StatusOr<std::optional<LoadedCheckpoint>>>& loads) {
  int64_t step = -2;
  for (size_t r = 0; r < loads.size(); ++r) {
    EXPECT_TRUE(loads[r].ok()) << "rank " << r << ": " << loads[r].status();
    if (!loads[r].ok()) return -2;
    const int64_t mine = loads[r]->has_value() ? (*loads[r])->step : -1;
    EXPECT_TRUE(step == -2 || step == mine) << "rank " << r << " loaded step " << mine;
    step = mine;
  }
  return step;
}

Load FromRoot(const std::string& root) {
  return [root](client::TrainerSession& s) { return s.LoadCheckpoint(root); };
}
Load Resume(ResumeRoots roots) {
  return [roots](client::TrainerSession& s) { return s.ResumeCheckpoint(roots); };
}

std::string Absolute(const std::string& root, int64_t step) {
  return StepDirectory(fs::absolute(root).string(), step);
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    out.insert(entry.path().filename().string());
  }
  return out;
}

// The job's records by step: "complete", "set aside", ...
std::map<int64_t, v1::CheckpointState> Records(ZerodHarness& zerod, const std::string& job) {
  auto records = zerod.Client()->ListCheckpoints(job);
  EXPECT_TRUE(records.ok()) << records.status();
  std::map<int64_t, v1::CheckpointState> out;
  if (records.ok()) {
    for (const v1::CheckpointRecord& r : *records) out[r.step()] = r.state();
  }
  return out;
}

// Failure injection: what rank 1's node sees of the shared filesystem.
std::string rank1_view;  // NOLINT: set before a load, read by the ranks' threads
std::string Rank1Sees(int64_t rank, const std::string& dir) {
  return rank == 1 ? rank1_view + "/" + fs::path(dir).filename().string() : dir;
}
struct ViewInjection {
  explicit ViewInjection(const std::string& view) {
    rank1_view = view;
    checkpoint::SetLoadViewInjectionForTesting(&Rank1Sees);
  }
  ~ViewInjection() { checkpoint::SetLoadViewInjectionForTesting(nullptr); }
};

// The case and the review's: another job's checkpoint copied in at a higher step, and this
// job's own checkpoint copied in as an "unrecorded snapshot" of this job at a higher step
// (recorded: false, its checksum recomputed). Neither is in the job's records: the resume takes
// the job's own newest and says why not the others.
TEST(CheckpointSelection, CopiedInAndForgedSnapshotCheckpointsAreNotResumedFrom) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir mine, theirs;
  SaveSteps(zerod, "mine", mine.path(), 2);
  SaveSteps(zerod, "theirs", theirs.path(), 3);
  fs::copy(StepDirectory(theirs.path(), 3), StepDirectory(mine.path(), 3),
           fs::copy_options::recursive);
  fs::copy(StepDirectory(mine.path(), 2), StepDirectory(mine.path(), 5),
           fs::copy_options::recursive);
  auto forged = checkpoint::ReadManifest(StepDirectory(mine.path(), 2));
  ASSERT_TRUE(forged.ok()) << forged.status();
  forged->step = forged->counters.steps_taken = forged->counters.applied_steps = 5;
  forged->recorded = false;
  ASSERT_TRUE(checkpoint::WriteManifest(StepDirectory(mine.path(), 5), *forged).ok());
  ASSERT_TRUE(checkpoint::Verify(StepDirectory(mine.path(), 5)).ok());

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "mine", Resume({"", {mine.path()}}))), 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, AllOf(HasSubstr(Absolute(mine.path(), 3) +
                                   " (not in job mine's records: saved by job theirs; another "
                                   "job's checkpoint loads only when its directory is named)"),
                         HasSubstr(Absolute(mine.path(), 5) +
                                   " (not in job mine's records: an unrecorded snapshot, taken "
                                   "only from the job's snapshot directory")));
}

// The review's case: another job's records never vouch for a directory of this job's root (any
// local user could record one over the Unix socket). A later job pointed at an earlier job's root
// does not resume from it, nor start afresh beside it in silence: the load fails saying whose the
// checkpoints are and how to go on. Naming the checkpoint is how it starts from another job's.
TEST(CheckpointSelection, AnotherJobsRecordsDoNotVouchForACheckpointButNamingItLoadsIt) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir root;
  SaveSteps(zerod, "earlier", root.path(), 2);
  for (const auto& load : LoadOnEveryRank(zerod, "later", FromRoot(root.path()))) {
    ASSERT_FALSE(load.ok());
    EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition) << load.status();
    EXPECT_THAT(std::string(load.status().message()),
                AllOf(HasSubstr(Absolute(root.path(), 2) +
                                " (not in job later's records: saved by job earlier; another "
                                "job's checkpoint loads only when its directory is named)"),
                      HasSubstr("refusing to start from scratch")));
  }
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "later", FromRoot(StepDirectory(root.path(), 2)))),
            2);
}

// Unrecorded snapshots count only in the snapshot directory (ResumeRoots::snapshots), and only
// while it is a directory of this user's that nobody else may write, as zerorun makes it.
TEST(CheckpointSelection, UnrecordedSnapshotsCountOnlyInTheJobsOwnSnapshotDirectory) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir durable, snapshots;  // both made by mkdtemp: 0700, this user's
  RunWorld(zerod, "snap", [&](int64_t r, client::TrainerSession& s, engine::ZeroEngine& e) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    checkpoint::SaveOptions o;
    o.root = durable.path();
    ASSERT_TRUE(s.SaveCheckpoint(o).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    o.root = snapshots.path();
    o.record = false;
    ASSERT_TRUE(s.SaveCheckpoint(o).ok());
  });
  EXPECT_EQ(
      LoadedStep(LoadOnEveryRank(zerod, "snap", Resume({snapshots.path(), {durable.path()}}))), 2);
  // Named as a durable root, the snapshot directory's unrecorded checkpoints do not count.
  EXPECT_EQ(
      LoadedStep(LoadOnEveryRank(zerod, "snap", Resume({"", {durable.path(), snapshots.path()}}))),
      1);
  ASSERT_EQ(chmod(snapshots.path().c_str(), 0777), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(
      LoadedStep(LoadOnEveryRank(zerod, "snap", Resume({snapshots.path(), {durable.path()}}))), 1);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("an unrecorded snapshot in " + snapshots.path() +
                        ", which others may write (mode 0777)"));
  ASSERT_EQ(chmod(snapshots.path().c_str(), 0700), 0);
}

// The review's critical case: rank 1's node lacks the shared filesystem, and then a file the
// manifest does not list sits in the newest checkpoint. Neither is damage: each load fails on every
// rank naming the problem, and every checkpoint and every record stays as it was; fixed, the
// newest loads.
TEST(CheckpointSelection, FailuresThatAreNotDamageLeaveEveryCheckpointAndRecordAsTheyWere) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir root;
  SaveSteps(zerod, "job", root.path(), 2);
  const std::set<std::string> entries = Entries(root.path());
  const std::map<int64_t, v1::CheckpointState> records = Records(zerod, "job");
  ASSERT_EQ(records, (std::map<int64_t, v1::CheckpointState>{{1, v1::CHECKPOINT_COMPLETE},
                                                             {2, v1::CHECKPOINT_COMPLETE}}));
  {
    ViewInjection unmounted(root.path() + "-not-mounted-on-rank-1");
    for (const auto& load : LoadOnEveryRank(zerod, "job", FromRoot(root.path()))) {
      ASSERT_FALSE(load.ok());
      EXPECT_EQ(load.status().code(), absl::StatusCode::kNotFound) << load.status();
      EXPECT_THAT(std::string(load.status().message()),
                  AllOf(HasSubstr("rank 1"), HasSubstr("does not exist")));
    }
  }
  EXPECT_EQ(Entries(root.path()), entries);
  EXPECT_EQ(Records(zerod, "job"), records);

  const std::string stray = StepDirectory(root.path(), 2) + "/model.safetensors";
  ASSERT_TRUE(checkpoint::ExportSafetensors(StepDirectory(root.path(), 2), stray).ok());
  for (const auto& load : LoadOnEveryRank(zerod, "job", Resume({"", {root.path()}}))) {
    ASSERT_FALSE(load.ok());
    EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition) << load.status();
    EXPECT_THAT(std::string(load.status().message()), HasSubstr(stray + " is not listed"));
  }
  EXPECT_EQ(Entries(root.path()), entries);
  EXPECT_EQ(Records(zerod, "job"), records);
  fs::remove(stray);
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "job", FromRoot(root.path()))), 2);
}

// Damage rank 0 finds (here by checking the checkpoint after rank 1 reported a block of its file)
// sets the checkpoint aside: renamed, recorded set aside (not removed), the older one loaded. Put
// back repaired, it is checked and loaded again; damaged again and set aside, the run saves that
// step anew.
TEST(CheckpointSelection, ADamagedCheckpointIsSetAsideRecordedSoAndCanBePutBackOrSavedAgain) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir root;
  SaveSteps(zerod, "job", root.path(), 3);
  const std::string step3 = StepDirectory(root.path(), 3);
  FlipBit(step3 + "/" + checkpoint::RankFileName(1), 20);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "job", Resume({"", {root.path()}}))), 2);
  EXPECT_THAT(
      ::testing::internal::GetCapturedStderr(),
      AllOf(HasSubstr("skipped newer: " + Absolute(root.path(), 3)), HasSubstr("checksum mismatch"),
            HasSubstr("set aside as " + Absolute(root.path(), 3) + ".damaged-"),
            HasSubstr("recorded set aside")));
  EXPECT_EQ(Records(zerod, "job")[3], v1::CHECKPOINT_SET_ASIDE);
  std::string aside;
  for (const std::string& name : Entries(root.path())) {
    if (name.find(".damaged-") != std::string::npos) aside = root.path() + "/" + name;
  }
  ASSERT_FALSE(aside.empty());

  // The operator repairs it and puts it back: checked again, and loaded.
  FlipBit(aside + "/" + checkpoint::RankFileName(1), 20);
  fs::rename(aside, step3);
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "job", Resume({"", {root.path()}}))), 3);

  // Damaged again: set aside again, and the run that goes on from step 2 saves step 3 anew.
  FlipBit(step3 + "/" + checkpoint::RankFileName(1), 20);
  RunWorld(zerod, "job", [&](int64_t r, client::TrainerSession& s, engine::ZeroEngine& e) {
    auto loaded = s.ResumeCheckpoint({"", {root.path()}});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_EQ((*loaded)->step, 2);
    ASSERT_TRUE(TrainStep(e, r).ok());
    checkpoint::SaveOptions o;
    o.root = root.path();
    auto saved = s.SaveCheckpoint(o);
    ASSERT_TRUE(saved.ok()) << "rank " << r << ": " << saved.status();
  });
  EXPECT_EQ(Records(zerod, "job")[3], v1::CHECKPOINT_COMPLETE);
  EXPECT_TRUE(checkpoint::Verify(step3).ok());
}

// The job's own checkpoint, its manifest rewritten consistently after the save (a forgery the
// manifest's checksum alone cannot catch): the record keeps the checksum of the manifest the job
// completed, so the load sets it aside and takes the one before.
TEST(CheckpointSelection, AManifestReplacedAfterItsSaveIsNotTheOneTheJobRecorded) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir root;
  SaveSteps(zerod, "job", root.path(), 2);
  auto m = checkpoint::ReadManifest(StepDirectory(root.path(), 2));
  ASSERT_TRUE(m.ok()) << m.status();
  m->user = "{\"epoch\": 99}";
  ASSERT_TRUE(checkpoint::WriteManifest(StepDirectory(root.path(), 2), *m).ok());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "job", FromRoot(root.path()))), 1);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              AllOf(HasSubstr("is not the manifest job job recorded complete"),
                    HasSubstr("set aside as " + Absolute(root.path(), 2) + ".damaged-")));
}

// The review's cases: the job's recorded checkpoints that are gone are named, never passed over in
// silence. Newest gone: the load falls back saying so, and the step may be saved again. All gone,
// or the root itself gone (a filesystem not mounted): the load refuses to start from scratch. An
// empty directory elsewhere is a first run.
TEST(CheckpointSelection, TheJobsOwnCheckpointsAreNeverPassedOverInSilence) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir base;
  const std::string root = base.path() + "/ckpt";
  SaveSteps(zerod, "job", root, 3);
  fs::remove_all(StepDirectory(root, 3));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "job", Resume({"", {root}}))), 2);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr(Absolute(root, 3) + " (recorded complete, but its directory is missing"));
  EXPECT_EQ(Records(zerod, "job")[3], v1::CHECKPOINT_SET_ASIDE);

  for (int64_t step : {1, 2}) fs::remove_all(StepDirectory(root, step));
  for (const auto& load : LoadOnEveryRank(zerod, "job", Resume({"", {root}}))) {
    ASSERT_FALSE(load.ok());
    EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition) << load.status();
    EXPECT_THAT(std::string(load.status().message()),
                AllOf(HasSubstr("job job's records list checkpoints under " + root),
                      HasSubstr(Absolute(root, 2) + " (recorded complete, but its directory is "
                                                    "missing)"),
                      HasSubstr("refusing to start from scratch")));
  }
  fs::rename(root, root + "-unmounted");
  for (const auto& load : LoadOnEveryRank(zerod, "job", FromRoot(root))) {
    ASSERT_FALSE(load.ok());
    EXPECT_THAT(std::string(load.status().message()),
                AllOf(HasSubstr(root + " does not exist here (is its filesystem mounted?)"),
                      HasSubstr("refusing to start from scratch")));
  }
  TempDir fresh;
  EXPECT_EQ(LoadedStep(LoadOnEveryRank(zerod, "job", FromRoot(fresh.path()))), -1);
}

// A partial step directory the job never recorded is another's (a job sharing the root may be
// writing it): a save of that step refuses it naming it, and leaves its files alone.
TEST(CheckpointSelection, ASaveDoesNotEmptyAPartialDirectoryItsJobNeverRecorded) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir root;
  fs::create_directories(StepDirectory(root.path(), 1));
  const std::string theirs = StepDirectory(root.path(), 1) + "/" + checkpoint::RankFileName(0);
  std::ofstream(theirs) << "being written by another job";
  RunWorld(zerod, "job", [&](int64_t r, client::TrainerSession& s, engine::ZeroEngine& e) {
    ASSERT_TRUE(TrainStep(e, r).ok());
    checkpoint::SaveOptions o;
    o.root = root.path();
    auto saved = s.SaveCheckpoint(o);
    ASSERT_FALSE(saved.ok()) << "rank " << r;
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition) << saved.status();
    EXPECT_THAT(std::string(saved.status().message()),
                AllOf(HasSubstr(Absolute(root.path(), 1)), HasSubstr("never recorded")));
  });
  std::ifstream in(theirs);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
            "being written by another job");
  EXPECT_THAT(Records(zerod, "job"), ::testing::IsEmpty());
}

// The case: a link planted for the step directory a save is about to make. The save is
// refused on every rank naming the link, nothing is written where it points, and keep_last still
// manages the job's own directories (step 1 removed, and so recorded) and leaves the link alone.
TEST(CheckpointSelection, ASaveNeverWritesThroughALinkPlantedForItsStepDirectory) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  TempDir root, elsewhere;
  fs::create_directory_symlink(elsewhere.path(), StepDirectory(root.path(), 2));
  RunWorld(zerod, "job", [&](int64_t r, client::TrainerSession& s, engine::ZeroEngine& e) {
    checkpoint::SaveOptions o;
    o.root = root.path();
    o.keep_last = 1;
    ASSERT_TRUE(TrainStep(e, r).ok());
    ASSERT_TRUE(s.SaveCheckpoint(o).ok());
    ASSERT_TRUE(TrainStep(e, r).ok());
    auto refused = s.SaveCheckpoint(o);
    ASSERT_FALSE(refused.ok()) << "rank " << r;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                AllOf(HasSubstr(Absolute(root.path(), 2)), HasSubstr("symbolic link")));
    ASSERT_TRUE(TrainStep(e, r).ok());
    auto third = s.SaveCheckpoint(o);
    ASSERT_TRUE(third.ok()) << "rank " << r << ": " << third.status();
  });
  EXPECT_TRUE(Entries(elsewhere.path()).empty()) << "written through the link";
  EXPECT_EQ(Entries(root.path()),
            (std::set<std::string>{"step-000000000002", "step-000000000003"}));
  EXPECT_TRUE(fs::is_symlink(StepDirectory(root.path(), 2)));
  EXPECT_EQ(Records(zerod, "job"), (std::map<int64_t, v1::CheckpointState>{
                                       {1, v1::CHECKPOINT_REMOVED}, {3, v1::CHECKPOINT_COMPLETE}}));
}

}  // namespace
}  // namespace zerod::testing
