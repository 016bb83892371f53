#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_SELECTION_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_SELECTION_H_

// Which step directories under a root are this job's checkpoints, by the job's records.
//
// With a Recorder (the coordinator's records), a step directory is a candidate when its manifest
// is in place and this job recorded it complete there; or when the job its manifest names did (an
// earlier run that saved into the same root: what lets a new job resume from it), with that very
// manifest; or when it is not recorded but is an in-memory snapshot of this job (its manifest says
// `recorded: false` and names the job). Without a Recorder (no coordinator) the root is taken as
// the job's own: every step directory with a manifest is a candidate. Never a candidate: a link
// named like a step (it would read as the step it points to), a save that did not finish (no
// manifest, or the record says saving), a checkpoint no record lists there (copied in). Candidates
// are vetted before every rank reads one (Vet); one found damaged is set aside (SetAside), so that
// the job can save that step again.

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

// Why a step directory is not a checkpoint to load.
enum class Skipped {
  kNo,           // a candidate
  kPartial,      // its save did not finish
  kNotThisJobs,  // a link, or a checkpoint the job's records do not list
  kDamaged,      // found damaged when vetted or read (DATA_LOSS, NOT_FOUND): set aside
  kUnusable,     // readable by no load as it is (a manifest of format 1: UpgradeManifest)
};

struct StepDir {
  int64_t step = 0;
  std::string dir;  // absolute
  Skipped skipped = Skipped::kNo;
  std::string why;                             // when skipped
  std::optional<CheckpointRecordInfo> record;  // this job's record of it, when there is one
  std::string saved_by;                        // another job whose record of it makes it count
  uint64_t recorded_manifest_xxh3 = 0;         // the manifest's checksum as recorded (0: not known)
};

// The step-named entries of `root`, oldest first, classified without reading a rank file (an
// unrecorded directory's manifest is read to learn whose it is). A missing root has none.
absl::StatusOr<std::vector<StepDir>> Scan(const std::string& root, Recorder* recorder);

// "<dir> (<why>), <dir> (<why>)".
std::string Describe(const std::vector<StepDir>& dirs);

// What rank 0 checks of a checkpoint before every rank reads it: its manifest (ReadManifest), that
// it is the one `recorded_by` recorded (d.recorded_manifest_xxh3, when known), and its files' names
// and sizes (CheckFiles). Reads no rank file.
absl::StatusOr<Manifest> Vet(const StepDir& d, const std::string& recorded_by);

// Sets a damaged checkpoint of this job aside: its record (if any) says removed, and the directory
// is renamed `<dir>.damaged-<unix ms>`, kept for the operator, no longer a step directory, so that
// the job can save that step again. Another job's is left in place. Best effort: what happened,
// for the log.
std::string SetAside(const StepDir& d, Recorder* recorder);

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_SELECTION_H_
