#ifndef ZEROD_TESTS_SERVER_STATUS_RUNNING_JOB_H_
#define ZEROD_TESTS_SERVER_STATUS_RUNNING_JOB_H_

// A real JobRegistry on a real SQLite file with a FakeClock, and a job formed in it, for the
// status views' tests: they read the registry as the daemon's does.

#include <memory>
#include <string>

#include "server/checkpoint_records.h"
#include "server/clock.h"
#include "server/job_registry.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::status {

class RunningJob {
 public:
  RunningJob();
  ~RunningJob();

  // Forms `job_id` with `world` ranks at `stage` (hosts "host<rank>", or `host` for every rank).
  void Form(const std::string& job_id, int64_t world, int stage = 2, const std::string& host = "");
  // A heartbeat of `rank` with its step, bytes sent (one collective) and memory (one category).
  void Heartbeat(const std::string& job_id, int64_t rank, int64_t step, int64_t comm_bytes,
                 int64_t params_bytes = 0);
  // Records a checkpoint of the job at `step` in `state`.
  void RecordCheckpoint(const std::string& job_id, int64_t step, v1::CheckpointState state,
                        const std::string& directory);

  server::FakeClock& clock() { return clock_; }
  server::JobRegistry& registry() { return *registry_; }
  server::CheckpointRecords& checkpoints() { return *checkpoints_; }

 private:
  testing::TempDir dir_;
  server::FakeClock clock_;
  std::unique_ptr<server::SqliteKvStore> kv_;
  std::unique_ptr<server::JobRegistry> registry_;
  std::unique_ptr<server::CheckpointRecords> checkpoints_;
};

}  // namespace zerod::status

#endif  // ZEROD_TESTS_SERVER_STATUS_RUNNING_JOB_H_
