#ifndef ZEROD_SERVER_CHECKPOINT_RECORDS_H_
#define ZEROD_SERVER_CHECKPOINT_RECORDS_H_

// CheckpointRecords: what the coordinator knows of each job's checkpoints (step, directory,
// world size, stage, saving / complete / removed / set aside), kept durably in the KvStore so that
// after a crash at any moment the last complete checkpoint is known. No gRPC here: the
// Coordinator's RecordCheckpoint and Inspect's ListCheckpoints call it.
//
// Layout: checkpoints/<job>/<step as 20 digits> holds the serialized v1::CheckpointRecord. It is
// outside jobs/<job>/ on purpose: a job's end deletes its store keys and StoreQuota counts what
// is under jobs/, and checkpoints must outlive the job (a new generation resumes from them).
//
// Rules (DecideCheckpoint): SAVING -> COMPLETE -> REMOVED, and SAVING -> REMOVED for an abandoned
// save; COMPLETE -> SET_ASIDE (a load found it damaged and took an older one) -> REMOVED; a
// step's current state again (same directory) is answered with the stored record, so a retried
// call changes nothing; SAVING of a step that is saving elsewhere, was removed or set aside, starts
// that save afresh; SAVING of a complete step is refused (a step is saved once). At most
// `max_records_per_job` records per job: a new one first drops the oldest removed ones, else it is
// RESOURCE_EXHAUSTED.
//
// Thread-safe. A job's records are changed by one call at a time (a read, a decision and a
// commit); later calls for the same job queue behind it, holding no thread, so reactors never
// block. `done` runs on the caller's thread or on the KvStore's writer thread.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"
#include "server/state/kv_store.h"
#include "zerod/v1/coordinator.pb.h"

namespace zerod::server {

struct CheckpointLimits {
  int64_t max_world_size = int64_t{1} << 20;  // zerod's --max-world-size
  int64_t max_job_id_bytes = 128;             // zerod's --max-job-id-bytes
  int64_t max_records_per_job = 1024;
};

inline constexpr size_t kMaxCheckpointDirectoryBytes = 4096;

std::string CheckpointsPrefix(const std::string& job_id);
std::string CheckpointKey(const std::string& job_id, int64_t step);

// Checks what a RecordCheckpoint request says on its own: the job id, and that the record's
// job id (when set) is that job, step >= 0, directory 1..4096 bytes without NUL, world size in
// [1, max_world_size], stage 0-3, a known state, bytes >= 0. INVALID_ARGUMENT naming the job and
// step.
absl::Status CheckCheckpointArgs(const std::string& job_id, const v1::CheckpointRecord& record,
                                 const CheckpointLimits& limits);

// What recording `request` over the job's stored records does: answer at once (an error, or the
// stored record when nothing changes), or commit `ops` and answer `record`.
struct CheckpointDecision {
  absl::StatusOr<v1::CheckpointRecord> record;
  std::vector<KvOp> ops;  // empty: nothing to write
};

// Decodes a stored record of `job_id` at `key`; nullopt (with `problem` filled) when it is not
// one: the daemon skips such a record and says so once in its log.
std::optional<v1::CheckpointRecord> DecodeCheckpoint(const std::string& job_id,
                                                     const KeyValue& stored, std::string* problem);

// The rules, as a pure function of the job's stored records (`stored`: everything under
// CheckpointsPrefix, in key order) and the time. `request` passed CheckCheckpointArgs.
CheckpointDecision DecideCheckpoint(const std::string& job_id, const v1::CheckpointRecord& request,
                                    const std::vector<KeyValue>& stored, absl::Time now,
                                    const CheckpointLimits& limits);

class CheckpointRecords {
 public:
  using RecordCallback = std::function<void(absl::StatusOr<v1::CheckpointRecord>)>;
  // OK when the job exists; else the error to answer (NOT_FOUND, or DATA_LOSS for a quarantined
  // job: JobRegistry::Missing).
  using JobLookup = std::function<absl::Status(const std::string& job_id)>;

  // `kv`, `clock` and whatever `job_status` uses must outlive the object, and the object every
  // commit it started (destroy it after the KvStore has drained).
  CheckpointRecords(KvStore* kv, const Clock* clock, JobLookup job_status, CheckpointLimits limits);
  CheckpointRecords(const CheckpointRecords&) = delete;
  CheckpointRecords& operator=(const CheckpointRecords&) = delete;

  // Records `record` for `job_id` durably; `done` runs exactly once, with the record as stored.
  void Record(const std::string& job_id, v1::CheckpointRecord record, RecordCallback done);

  // The job's records ordered by step; records that do not decode are skipped (and logged once).
  absl::StatusOr<std::vector<v1::CheckpointRecord>> List(const std::string& job_id) const;

 private:
  struct Pending {
    v1::CheckpointRecord record;
    RecordCallback done;
  };

  // Takes the front request of `job_id` off its queue; `more`: others wait behind it.
  RecordCallback PopFront(const std::string& job_id, bool* more);
  // Decides and commits the requests queued for `job_id`, front first, until one waits for its
  // commit (whose callback goes on) or the queue is empty.
  void Drain(const std::string& job_id);
  // The job's stored records, logging the bad ones not logged before.
  std::vector<KeyValue> Stored(const std::string& job_id) const;

  KvStore* const kv_;
  const Clock* const clock_;
  const JobLookup job_status_;
  const CheckpointLimits limits_;

  mutable Mutex mu_;
  // Requests per job; the front one is being decided or committed. No entry: none queued.
  std::map<std::string, std::deque<Pending>> queues_ ABSL_GUARDED_BY(mu_);
  // Keys of bad records already logged, so that listing them again does not flood the log.
  mutable std::set<std::string> reported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_CHECKPOINT_RECORDS_H_
