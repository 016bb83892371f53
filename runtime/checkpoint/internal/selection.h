#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_SELECTION_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_SELECTION_H_

// Which step directories under a root are this job's checkpoints, by the job's own records.
//
// With a Recorder (the coordinator's records), a step directory is a candidate when its manifest
// is in place and this job recorded it complete there (or set aside, and the operator put it back);
// or, in the snapshot root alone, when it is an unrecorded in-memory snapshot of this job (its
// manifest says `recorded: false` and names the job) and that root is a directory of this user's
// that nobody else may write (zerorun's mkdtemp). Another job's records never vouch for a
// directory: another job's checkpoint loads only when named. Without a Recorder (no coordinator)
// the root is taken as the job's own: every step directory with a manifest is a candidate. Never
// a candidate: a link named like a step (it would read as the step it points to), a save that did
// not finish, a checkpoint no record of this job lists there (copied in, another job's). A record
// of this job saying complete whose directory is gone is listed too (kMissing), so that nothing
// the job saved disappears from a load without a word. Candidates are vetted before every rank
// reads one (Vet); one found damaged is set aside (SetAside), so that the job can save that step
// again.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/save_protocol.h"

namespace zerod::checkpoint::internal {

// `path` made absolute and lexically normal: how directories are compared with records.
std::string Absolute(const std::string& path);
bool HasManifest(const std::string& dir);
const char* StateName(RecordState state);

// The coordinator's records by (absolute) directory; empty without a recorder.
absl::StatusOr<std::map<std::string, CheckpointRecordInfo>> RecordsByDirectory(Recorder* recorder);

// What a root holds: durable checkpoints, or the job's in-memory snapshots (ResumeRoots).
enum class RootKind { kDurable, kSnapshots };

// Why a step directory is not a checkpoint to load.
enum class Skipped {
  kNo,           // a candidate
  kPartial,      // its save did not finish
  kNotThisJobs,  // a link, a checkpoint the job's records do not list, a snapshot out of place
  kDamaged,      // found damaged by rank 0 (internal/damage.h): set aside
  kMissing,      // the job's records say complete (or set aside) here; no directory is here
};

struct StepDir {
  int64_t step = 0;
  std::string dir;  // absolute
  Skipped skipped = Skipped::kNo;
  std::string why;                             // when skipped
  std::optional<CheckpointRecordInfo> record;  // this job's record of it, when there is one
  uint64_t recorded_manifest_xxh3 = 0;         // the manifest's checksum as recorded (0: not known)
  bool whole = false;  // kNotThisJobs: a complete checkpoint all the same (another job's, ...)
};

// The step-named entries of `root`, oldest first, classified without reading a rank file (an
// unrecorded directory's manifest is read to learn whose it is), and the job's complete records
// under `root` whose directory is missing (all of them when `root` itself is).
absl::StatusOr<std::vector<StepDir>> Scan(const std::string& root, RootKind kind,
                                          Recorder* recorder);

// "<dir> (<why>), <dir> (<why>)".
std::string Describe(const std::vector<StepDir>& dirs);

// What rank 0 checks of a checkpoint before every rank reads it: its manifest (ReadManifest), that
// it is the one the job recorded (d.recorded_manifest_xxh3, when known), and its files' names and
// sizes (CheckFiles). Reads no rank file. A failure that is damage (internal/damage.h) is rank 0's
// own finding.
absl::StatusOr<Manifest> Vet(const StepDir& d, const std::string& job_id);

// Sets a damaged (or, after a load fell back past it, missing) checkpoint of this job aside: its
// record (if any) says set aside, not removed, so that the job may save the step again and the
// operator may put the directory back; the directory, when there, is renamed
// `<dir>.damaged-<unix ms>`, kept for the operator, no longer a step directory. Best effort: what
// happened, for the log.
std::string SetAside(const StepDir& d, Recorder* recorder);

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_SELECTION_H_
