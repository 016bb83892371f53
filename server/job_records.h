#ifndef ZEROD_SERVER_JOB_RECORDS_H_
#define ZEROD_SERVER_JOB_RECORDS_H_

// How jobs are laid out in the KvStore, and the encoding of each record:
//   jobs/<job>/meta               JSON: world size, generation, state, options, layout digest
//   jobs/<job>/plan               binary v1::PlanInputs of the current generation
//   jobs/<job>/members/<rank>     JSON: host, device, budget, state, generation, layout digest
//   jobs/<job>/kv/<key>           the job's Store values, as given
//   quarantine/<job>/r<revision>/ a job whose records were damaged or did not decode at a start
//                                 (JobRegistry::Recover): every record it had, moved here at that
//                                 revision, and `reason`, why
// Heartbeat statistics are never stored.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/job.h"
#include "server/state/kv_store.h"

namespace zerod::server {

std::string JobPrefix(const std::string& job_id);
std::string MetaKey(const std::string& job_id);
std::string PlanKey(const std::string& job_id);
std::string MembersPrefix(const std::string& job_id);
std::string MemberKey(const std::string& job_id, int64_t rank);
std::string StoreKeyPrefix(const std::string& job_id);
// The job a key under jobs/ belongs to; empty for any other key.
std::string JobOfKey(const std::string& key);

// Records of a job; callers hold job.mu.
// The meta record as it will be after a change to `generation` and `state`.
std::string EncodeMeta(const Job& job, int64_t generation, v1::JobState state)
    ABSL_SHARED_LOCKS_REQUIRED(job.mu);
std::string EncodeMember(const Member& member);

// The records of a job forming with `inputs`: meta and plan of the new generation, and every
// member present, joining ones recorded as active in it.
std::vector<KvOp> FormationRecords(const Job& job, const v1::PlanInputs& inputs)
    ABSL_SHARED_LOCKS_REQUIRED(job.mu);

// Rebuilds one job from its records (meta, plan, members). Active members get a lease that ends
// at `lease_expiry` (the restart grace).
absl::StatusOr<std::shared_ptr<Job>> DecodeJob(const std::string& job_id,
                                               const std::vector<KeyValue>& records,
                                               absl::Time lease_expiry);

// Moves every record of `job_id` (the intact and the damaged ones, values as stored) to
// quarantine/<job>/r<revision>/ with a `reason` record, and deletes them from jobs/<job>/, so
// that the id starts afresh if it is joined again. Returns the ops and the prefix moved to.
std::pair<std::vector<KvOp>, std::string> QuarantineRecords(
    const std::string& job_id, const std::vector<KeyValue>& intact,
    const std::vector<DamagedRecord>& damaged, int64_t revision, const std::string& reason);

// Quarantined job -> why, and where its records are; the latest quarantine of each id.
std::map<std::string, std::string> QuarantinedJobs(const std::vector<KeyValue>& records);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOB_RECORDS_H_
