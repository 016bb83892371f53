// CheckpointRecords on a real SQLite store and a FakeClock: the arguments it refuses, the
// transitions it allows, retries that change nothing, the cap per job, records that do not
// decode, durability across a reopen, concurrent calls for one job, and a job's quarantine at a
// start leaving them where they are.

#include "server/checkpoint_records.h"

#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_registry.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kJob[] = "train";

v1::CheckpointRecord Checkpoint(int64_t step, v1::CheckpointState state,
                                const std::string& directory = "/ckpt/step") {
  v1::CheckpointRecord r;
  r.set_step(step);
  r.set_directory(directory);
  r.set_world_size(4);
  r.set_stage(2);
  r.set_state(state);
  return r;
}

std::vector<int64_t> Steps(const std::vector<v1::CheckpointRecord>& records) {
  std::vector<int64_t> steps;
  for (const v1::CheckpointRecord& r : records) steps.push_back(r.step());
  return steps;
}

class CheckpointRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open(CheckpointLimits limits = {}) {
    records_.reset();
    kv_.reset();
    kv_ = *SqliteKvStore::Open(dir_.path() + "/state.db", Durability::kNormal);
    records_ = std::make_unique<CheckpointRecords>(
        kv_.get(), &clock_,
        [](const std::string& job_id) {
          return job_id == kJob ? absl::OkStatus()
                                : absl::NotFoundError("job " + job_id + " not found");
        },
        limits);
  }

  absl::StatusOr<v1::CheckpointRecord> Record(const v1::CheckpointRecord& record,
                                              const std::string& job_id = kJob) {
    std::promise<absl::StatusOr<v1::CheckpointRecord>> answered;
    records_->Record(job_id, record, [&answered](absl::StatusOr<v1::CheckpointRecord> r) {
      answered.set_value(std::move(r));
    });
    return answered.get_future().get();
  }

  std::vector<v1::CheckpointRecord> List() {
    auto listed = records_->List(kJob);
    EXPECT_TRUE(listed.ok()) << listed.status();
    return listed.ok() ? *listed : std::vector<v1::CheckpointRecord>{};
  }

  testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<SqliteKvStore> kv_;
  std::unique_ptr<CheckpointRecords> records_;
};

TEST_F(CheckpointRecordsTest, ASaveRecordedThenCompletedIsKeptWithTheDaemonsTimesAcrossAReopen) {
  const int64_t start_ms = absl::ToUnixMillis(clock_.Now());
  auto saving = Record(Checkpoint(100, v1::CHECKPOINT_SAVING, "/ckpt/100"));
  ASSERT_TRUE(saving.ok()) << saving.status();
  EXPECT_EQ(saving->job_id(), kJob);
  EXPECT_EQ(saving->created_unix_ms(), start_ms);
  EXPECT_EQ(saving->completed_unix_ms(), 0);

  clock_.Advance(absl::Seconds(30));
  v1::CheckpointRecord complete = Checkpoint(100, v1::CHECKPOINT_COMPLETE, "/ckpt/100");
  complete.set_bytes(123456);
  complete.set_manifest_xxh3(0xfedcba9876543210ull);
  complete.set_created_unix_ms(1);  // the caller's times are not taken
  ASSERT_TRUE(Record(complete).ok());

  Open();
  const std::vector<v1::CheckpointRecord> listed = List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state(), v1::CHECKPOINT_COMPLETE);
  EXPECT_EQ(listed[0].directory(), "/ckpt/100");
  EXPECT_EQ(listed[0].world_size(), 4);
  EXPECT_EQ(listed[0].stage(), 2);
  EXPECT_EQ(listed[0].bytes(), 123456);
  // The manifest the job completed: a loader takes that one only.
  EXPECT_EQ(listed[0].manifest_xxh3(), 0xfedcba9876543210ull);
  EXPECT_EQ(listed[0].created_unix_ms(), start_ms);
  EXPECT_EQ(listed[0].completed_unix_ms(), start_ms + 30'000);
  // Outside jobs/<job>/, where a job's end deletes its store and StoreQuota counts.
  EXPECT_TRUE(kv_->Get("checkpoints/train/00000000000000000100").has_value());
}

TEST_F(CheckpointRecordsTest, AnUnknownJobIsRefusedWithTheLookupsAnswerAndNothingIsWritten) {
  auto r = Record(Checkpoint(1, v1::CHECKPOINT_SAVING), "ghost");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("job ghost not found"));
  EXPECT_EQ(records_->List("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(kv_->Range("checkpoints/"), IsEmpty());
}

TEST_F(CheckpointRecordsTest, MalformedRecordsAreRefusedNamingTheJobStepAndValue) {
  struct Case {
    std::function<void(v1::CheckpointRecord&)> change;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](v1::CheckpointRecord& r) { r.set_step(-1); }, "step -1: the step is negative"},
      {[](v1::CheckpointRecord& r) { r.set_directory(""); }, "the directory is empty"},
      {[](v1::CheckpointRecord& r) { r.set_directory(std::string(4097, 'd')); },
       "the directory is 4097 bytes, more than 4096"},
      {[](v1::CheckpointRecord& r) { r.set_directory(std::string("/a\0b", 4)); }, "NUL byte"},
      {[](v1::CheckpointRecord& r) { r.set_world_size(0); },
       "world size 0 is outside [1, 1048576]"},
      {[](v1::CheckpointRecord& r) { r.set_world_size(int64_t{1} << 21); },
       "world size 2097152 is outside"},
      {[](v1::CheckpointRecord& r) { r.set_stage(4); }, "stage 4 is not 0-3"},
      {[](v1::CheckpointRecord& r) { r.set_stage(-1); }, "stage -1 is not 0-3"},
      {[](v1::CheckpointRecord& r) { r.set_state(v1::CHECKPOINT_STATE_UNSPECIFIED); },
       "state 0 is not one of saving, complete, removed, set aside"},
      {[](v1::CheckpointRecord& r) { r.set_state(static_cast<v1::CheckpointState>(9)); },
       "state 9 is not one of"},
      {[](v1::CheckpointRecord& r) { r.set_bytes(-5); }, "bytes -5 is negative"},
      {[](v1::CheckpointRecord& r) { r.set_job_id("other"); }, "the record names job 'other'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    v1::CheckpointRecord r = Checkpoint(7, v1::CHECKPOINT_SAVING);
    c.change(r);
    auto refused = Record(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("job train"));
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(c.says));
  }
  EXPECT_EQ(Record(Checkpoint(7, v1::CHECKPOINT_SAVING), "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(kv_->Range("checkpoints/"), IsEmpty());
}

TEST_F(CheckpointRecordsTest, OnlySavingCompleteRemovedInThatOrderOrSavingRemovedAreAccepted) {
  // Nothing recorded yet: only a save may start.
  for (v1::CheckpointState state : {v1::CHECKPOINT_COMPLETE, v1::CHECKPOINT_REMOVED}) {
    auto r = Record(Checkpoint(1, state));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("job train: checkpoint at step 1: none is recorded"));
  }
  ASSERT_TRUE(Record(Checkpoint(1, v1::CHECKPOINT_SAVING)).ok());
  ASSERT_TRUE(Record(Checkpoint(1, v1::CHECKPOINT_COMPLETE)).ok());
  ASSERT_TRUE(Record(Checkpoint(1, v1::CHECKPOINT_REMOVED)).ok());
  auto revived = Record(Checkpoint(1, v1::CHECKPOINT_COMPLETE));
  EXPECT_EQ(revived.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(revived.status().message()), HasSubstr("step 1: it was removed"));

  // An abandoned save is removed without ever completing.
  ASSERT_TRUE(Record(Checkpoint(2, v1::CHECKPOINT_SAVING)).ok());
  auto abandoned = Record(Checkpoint(2, v1::CHECKPOINT_REMOVED));
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  EXPECT_EQ(abandoned->completed_unix_ms(), 0);

  // Completing needs the directory, world size and stage the save started with.
  ASSERT_TRUE(Record(Checkpoint(3, v1::CHECKPOINT_SAVING, "/ckpt/a")).ok());
  auto elsewhere = Record(Checkpoint(3, v1::CHECKPOINT_COMPLETE, "/ckpt/b"));
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(elsewhere.status().message()),
              HasSubstr("step 3: it is recorded saving in '/ckpt/a', not '/ckpt/b'"));
  v1::CheckpointRecord resized = Checkpoint(3, v1::CHECKPOINT_COMPLETE, "/ckpt/a");
  resized.set_world_size(2);
  auto mismatch = Record(resized);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mismatch.status().message()),
              HasSubstr("saved at world size 4 and stage 2, not world size 2 and stage 2"));

  EXPECT_THAT(Steps(List()), ElementsAre(1, 2, 3));
  EXPECT_EQ(List()[2].state(), v1::CHECKPOINT_SAVING);
}

TEST_F(CheckpointRecordsTest, ACompleteCheckpointIsNeverSavedAgainElsewhereOrInPlace) {
  ASSERT_TRUE(Record(Checkpoint(5, v1::CHECKPOINT_SAVING, "/ckpt/5")).ok());
  ASSERT_TRUE(Record(Checkpoint(5, v1::CHECKPOINT_COMPLETE, "/ckpt/5")).ok());
  for (const char* directory : {"/elsewhere/5", "/ckpt/5"}) {
    SCOPED_TRACE(directory);
    auto again = Record(Checkpoint(5, v1::CHECKPOINT_SAVING, directory));
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(again.status().message()),
                HasSubstr("job train: checkpoint at step 5: it is recorded complete in '/ckpt/5'; "
                          "a complete checkpoint is not saved again"));
  }
  ASSERT_EQ(List().size(), 1u);
  EXPECT_EQ(List()[0].state(), v1::CHECKPOINT_COMPLETE);
  EXPECT_EQ(List()[0].directory(), "/ckpt/5");
}

TEST_F(CheckpointRecordsTest, TheSameStateAgainAnswersTheStoredRecordUnchanged) {
  auto first = Record(Checkpoint(9, v1::CHECKPOINT_SAVING));
  ASSERT_TRUE(first.ok());
  const int64_t revision = kv_->revision();
  for (v1::CheckpointState state :
       {v1::CHECKPOINT_SAVING, v1::CHECKPOINT_COMPLETE, v1::CHECKPOINT_REMOVED}) {
    SCOPED_TRACE(v1::CheckpointState_Name(state));
    if (state != v1::CHECKPOINT_SAVING) {
      clock_.Advance(absl::Seconds(1));
      ASSERT_TRUE(Record(Checkpoint(9, state)).ok());
    }
    const v1::CheckpointRecord stored = List()[0];
    const int64_t before = kv_->revision();
    clock_.Advance(absl::Seconds(5));
    // A retry after a lost reply.
    auto retried = Record(Checkpoint(9, state));
    ASSERT_TRUE(retried.ok()) << retried.status();
    EXPECT_EQ(retried->SerializeAsString(), stored.SerializeAsString());
    EXPECT_EQ(kv_->revision(), before) << "a retry writes nothing";
  }
  EXPECT_EQ(kv_->revision(), revision + 2);  // complete, removed
}

TEST_F(CheckpointRecordsTest, ASaveAbandonedAtAStepStartsAfreshWhenTheStepIsSavedAgain) {
  ASSERT_TRUE(Record(Checkpoint(4, v1::CHECKPOINT_SAVING, "/gen1/4")).ok());
  clock_.Advance(absl::Minutes(1));
  v1::CheckpointRecord again = Checkpoint(4, v1::CHECKPOINT_SAVING, "/gen2/4");
  again.set_world_size(3);
  auto restarted = Record(again);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(restarted->directory(), "/gen2/4");
  EXPECT_EQ(restarted->world_size(), 3);
  EXPECT_EQ(restarted->created_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  ASSERT_TRUE(Record(Checkpoint(4, v1::CHECKPOINT_REMOVED, "/gen2/4")).ok());
  // A removed step may be saved again (a run rolled back past it).
  ASSERT_TRUE(Record(Checkpoint(4, v1::CHECKPOINT_SAVING, "/gen3/4")).ok());
  EXPECT_EQ(List()[0].state(), v1::CHECKPOINT_SAVING);
  EXPECT_EQ(List()[0].directory(), "/gen3/4");
}

// A complete checkpoint a load found damaged is set aside: never completed again as it is, but its
// step may be saved again (the run went on from an older one); only a complete one is set aside.
TEST_F(CheckpointRecordsTest, ACompleteCheckpointSetAsideMayBeSavedAgainButNotCompletedAsItIs) {
  auto early = Record(Checkpoint(8, v1::CHECKPOINT_SET_ASIDE, "/ckpt/8"));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Record(Checkpoint(8, v1::CHECKPOINT_SAVING, "/ckpt/8")).ok());
  auto saving = Record(Checkpoint(8, v1::CHECKPOINT_SET_ASIDE, "/ckpt/8"));
  EXPECT_EQ(saving.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(saving.status().message()),
              HasSubstr("it is recorded saving; only a complete checkpoint is set aside"));
  ASSERT_TRUE(Record(Checkpoint(8, v1::CHECKPOINT_COMPLETE, "/ckpt/8")).ok());
  EXPECT_EQ(Record(Checkpoint(8, v1::CHECKPOINT_SET_ASIDE, "/elsewhere/8")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto aside = Record(Checkpoint(8, v1::CHECKPOINT_SET_ASIDE, "/ckpt/8"));
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_EQ(aside->state(), v1::CHECKPOINT_SET_ASIDE);
  ASSERT_TRUE(Record(Checkpoint(8, v1::CHECKPOINT_SET_ASIDE, "/ckpt/8")).ok()) << "a retry";
  auto revived = Record(Checkpoint(8, v1::CHECKPOINT_COMPLETE, "/ckpt/8"));
  EXPECT_EQ(revived.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(revived.status().message()), HasSubstr("it was set aside"));
  ASSERT_TRUE(Record(Checkpoint(8, v1::CHECKPOINT_SAVING, "/ckpt/8")).ok());
  ASSERT_TRUE(Record(Checkpoint(8, v1::CHECKPOINT_COMPLETE, "/ckpt/8")).ok());
  EXPECT_EQ(List()[0].state(), v1::CHECKPOINT_COMPLETE);
}

TEST_F(CheckpointRecordsTest, AFullJobDropsItsOldestRemovedRecordsElseRefusesANewOne) {
  Open(CheckpointLimits{.max_records_per_job = 4});
  for (int64_t step : {10, 20, 30, 40}) {
    ASSERT_TRUE(Record(Checkpoint(step, v1::CHECKPOINT_SAVING)).ok());
  }
  auto full = Record(Checkpoint(50, v1::CHECKPOINT_SAVING));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.status().message()),
              HasSubstr("job train: checkpoint at step 50: the job holds 4 checkpoint records"));
  // Changing a step already recorded needs no room.
  ASSERT_TRUE(Record(Checkpoint(40, v1::CHECKPOINT_COMPLETE)).ok());
  ASSERT_TRUE(Record(Checkpoint(20, v1::CHECKPOINT_REMOVED)).ok());
  ASSERT_TRUE(Record(Checkpoint(10, v1::CHECKPOINT_REMOVED)).ok());
  ASSERT_TRUE(Record(Checkpoint(50, v1::CHECKPOINT_SAVING)).ok());
  EXPECT_THAT(Steps(List()), ElementsAre(20, 30, 40, 50));
  ASSERT_TRUE(Record(Checkpoint(60, v1::CHECKPOINT_SAVING)).ok());
  EXPECT_THAT(Steps(List()), ElementsAre(30, 40, 50, 60));
  EXPECT_EQ(Record(Checkpoint(70, v1::CHECKPOINT_SAVING)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(CheckpointRecordsTest, ConcurrentCallsForOneJobNeverPassTheCap) {
  Open(CheckpointLimits{.max_records_per_job = 3});
  constexpr int kCalls = 12;
  std::vector<std::promise<absl::StatusOr<v1::CheckpointRecord>>> answers(kCalls);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([this, i, &answers] {
      records_->Record(kJob, Checkpoint(i, v1::CHECKPOINT_SAVING),
                       [&answers, i](absl::StatusOr<v1::CheckpointRecord> r) {
                         answers[i].set_value(std::move(r));
                       });
    });
  }
  for (std::thread& t : callers) t.join();
  int recorded = 0, refused = 0;
  for (auto& answer : answers) {
    const absl::StatusOr<v1::CheckpointRecord> r = answer.get_future().get();
    if (r.ok()) {
      ++recorded;
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      ++refused;
    }
  }
  EXPECT_EQ(recorded, 3);
  EXPECT_EQ(refused, kCalls - 3);
  EXPECT_EQ(List().size(), 3u);
}

TEST_F(CheckpointRecordsTest, RecordsThatDoNotDecodeAreSkippedAndAFreshSaveReplacesOne) {
  ASSERT_TRUE(Record(Checkpoint(1, v1::CHECKPOINT_SAVING)).ok());
  v1::CheckpointRecord wrong_step = Checkpoint(99, v1::CHECKPOINT_COMPLETE);
  wrong_step.set_job_id(kJob);
  v1::CheckpointRecord bad_state = Checkpoint(4, v1::CHECKPOINT_SAVING);
  bad_state.set_job_id(kJob);
  bad_state.set_state(static_cast<v1::CheckpointState>(42));
  ASSERT_TRUE(kv_->CommitSync({KvOp::Put(CheckpointKey(kJob, 2), "\xff\xff not a record"),
                               KvOp::Put(CheckpointKey(kJob, 3), wrong_step.SerializeAsString()),
                               KvOp::Put(CheckpointKey(kJob, 4), bad_state.SerializeAsString()),
                               KvOp::Put("checkpoints/train/x", "a key of no step")})
                  .ok());
  EXPECT_THAT(Steps(List()), ElementsAre(1));
  // Nothing follows from a record that cannot be read; a new save overwrites it.
  EXPECT_EQ(Record(Checkpoint(2, v1::CHECKPOINT_COMPLETE)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Record(Checkpoint(2, v1::CHECKPOINT_SAVING)).ok());
  EXPECT_THAT(Steps(List()), ElementsAre(1, 2));
}

TEST_F(CheckpointRecordsTest, RecordsAreListedInStepOrderWhateverOrderTheyCameIn) {
  for (int64_t step : std::vector<int64_t>{1000, 2, 30, int64_t{1} << 62, 0}) {
    ASSERT_TRUE(Record(Checkpoint(step, v1::CHECKPOINT_SAVING)).ok());
  }
  EXPECT_THAT(Steps(List()), ElementsAre(0, 2, 30, 1000, int64_t{1} << 62));
}

TEST_F(CheckpointRecordsTest, AQuarantinedJobsRecordsStayWhereTheyAreAndAreNotTakenForAJob) {
  ASSERT_TRUE(Record(Checkpoint(1, v1::CHECKPOINT_SAVING)).ok());
  ASSERT_TRUE(Record(Checkpoint(1, v1::CHECKPOINT_COMPLETE)).ok());
  const std::vector<KeyValue> before = kv_->Range("checkpoints/");
  // The job's own records do not decode: a start quarantines it.
  ASSERT_TRUE(kv_->CommitSync({KvOp::Put("jobs/train/meta", "{not json")}).ok());
  JobRegistry registry(kv_.get(), &clock_, RegistryOptions{});
  ASSERT_TRUE(registry.Recover().ok());
  EXPECT_THAT(registry.ListJobs(), IsEmpty());
  EXPECT_EQ(registry.Missing(kJob).code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(kv_->Range("jobs/"), IsEmpty());
  for (const KeyValue& kv : kv_->Range("quarantine/")) {
    EXPECT_THAT(kv.key, Not(HasSubstr("checkpoints"))) << "moved with the job's records";
  }
  const std::vector<KeyValue> after = kv_->Range("checkpoints/");
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(after[0].key, before[0].key);
  EXPECT_EQ(after[0].value, before[0].value);
  // While quarantined, the daemon's lookup answers for the job: its records are not listed.
  CheckpointRecords gated(kv_.get(), &clock_,
                          [&registry](const std::string& id) {
                            return registry.JobExists(id) ? absl::OkStatus() : registry.Missing(id);
                          },
                          {});
  EXPECT_EQ(gated.List(kJob).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace zerod::server
