#ifndef ZEROD_TESTS_RUNTIME_CHECKPOINT_SAVE_JOB_H_
#define ZEROD_TESTS_RUNTIME_CHECKPOINT_SAVE_JOB_H_

// A job for tests of the save and load protocol (save_protocol.h): real ranks as threads with
// their own Gloo communicators over loopback and one InMemoryStore as the job's store. Tests with
// the coordinator's real records run against a real zerod (tests/integration/
// checkpoint_selection_test.cc); FailureInjectingRecorder is for the failures a real zerod does
// not make on demand.

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

// Failure injection: the coordinator's records kept in memory (the latest state per directory,
// and every call in order), with failures a test asks for: a record of a complete checkpoint
// that fails, a crash between the manifest and its record.
class FailureInjectingRecorder final : public Recorder {
 public:
  explicit FailureInjectingRecorder(std::string job_id = "test") : job_id_(std::move(job_id)) {}
  absl::Status Record(const CheckpointRecordInfo& record) override;
  absl::StatusOr<std::vector<CheckpointRecordInfo>> List() override;
  const std::string& job_id() const override { return job_id_; }
  std::vector<CheckpointRecordInfo> calls();
  // The next record of a complete checkpoint fails.
  void FailNextComplete();
  // Says `dir` is still being saved, as after a crash between the manifest and the record.
  void MarkSaving(const std::string& dir);

 private:
  const std::string job_id_;
  Mutex mu_;
  std::vector<CheckpointRecordInfo> calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CheckpointRecordInfo> latest_ ABSL_GUARDED_BY(mu_);
  bool fail_complete_ ABSL_GUARDED_BY(mu_) = false;
};

// A fresh directory's `ckpt` (not created).
std::string TempRoot();

// One job: `world` ranks at `stage`, each with an engine initialised the same way, running
// `body(rank, engine, store)` on its own thread.
void RunJob(int stage, int64_t world,
            const std::function<void(int64_t, engine::ZeroEngine&, comm::Store&)>& body);

// The parameters every job's ranks start from (the same on every rank).
absl::Status InitJobParameters(engine::ZeroEngine& e);

// One training step with gradients that depend on the rank, the step and the weights.
absl::Status TrainStep(engine::ZeroEngine& e, int64_t rank);

// Save options of job "test" under `root`, with a 5-minute timeout.
SaveOptions Options(const std::string& root, int64_t keep_last = 0);

}  // namespace zerod::checkpoint::testing

#endif  // ZEROD_TESTS_RUNTIME_CHECKPOINT_SAVE_JOB_H_
