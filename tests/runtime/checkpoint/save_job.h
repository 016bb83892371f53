#ifndef ZEROD_TESTS_RUNTIME_CHECKPOINT_SAVE_JOB_H_
#define ZEROD_TESTS_RUNTIME_CHECKPOINT_SAVE_JOB_H_

// A job for tests of the save and load protocol (save_protocol.h): real ranks as threads with
// their own Gloo communicators over loopback, one InMemoryStore as the job's store, and
// FakeRecorder standing in for the coordinator's records.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/checkpoint/save_protocol.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::checkpoint::testing {

// Four small fp32 tensors.
std::vector<plan::TensorSpec> JobLayout();

// The coordinator's records, faked: the latest state per directory, and every call in order.
class FakeRecorder final : public Recorder {
 public:
  explicit FakeRecorder(std::string job_id = "test") : job_id_(std::move(job_id)) {}
  absl::Status Record(const CheckpointRecordInfo& record) override;
  absl::StatusOr<std::vector<CheckpointRecordInfo>> List() override;
  absl::StatusOr<std::vector<CheckpointRecordInfo>> ListOf(const std::string& job_id) override;
  const std::string& job_id() const override { return job_id_; }
  // ListOf(other.job_id()) lists `other`'s records (a coordinator that knows both jobs).
  void SeesRecordsOf(FakeRecorder* other);
  std::vector<CheckpointRecordInfo> calls();
  // Failure injection: the next record of a complete checkpoint fails.
  void FailNextComplete();
  // Says `dir` is still being saved, as after a crash between the manifest and the record.
  void MarkSaving(const std::string& dir);

 private:
  const std::string job_id_;
  Mutex mu_;
  std::vector<CheckpointRecordInfo> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CheckpointRecordInfo> latest_ ABSL_GUARDED_BY(mu_);
  bool fail_complete_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<FakeRecorder*> others_ ABSL_GUARDED_BY(mu_);
};

// A fresh directory's `ckpt` (not created).
std::string TempRoot();

// One job: `world` ranks at `stage`, each with an engine initialised the same way, running
// `body(rank, engine, store)` on its own thread.
void RunJob(int stage, int64_t world,
            const std::function<void(int64_t, engine::ZeroEngine&, comm::Store&)>& body);

// One training step with gradients that depend on the rank, the step and the weights.
absl::Status TrainStep(engine::ZeroEngine& e, int64_t rank);

// Save options of job "test" under `root`, with a 5-minute timeout.
SaveOptions Options(const std::string& root, int64_t keep_last = 0);

}  // namespace zerod::checkpoint::testing

#endif  // ZEROD_TESTS_RUNTIME_CHECKPOINT_SAVE_JOB_H_
