#ifndef ZEROD_RUNTIME_CHECKPOINT_SAVE_PROTOCOL_H_
#define ZEROD_RUNTIME_CHECKPOINT_SAVE_PROTOCOL_H_

// Who waits for whom when a job saves or loads a sharded checkpoint (the files themselves are
// checkpoint_files.h). Every rank of the engine's world calls Save (or Load) at the same step.
//
// Save at step S:
//   1. rank 0 records the save as started (Recorder::Started: the coordinator's durable record
//      says "saving"), every rank creates the step directory;
//   2. every rank writes its own file in parallel (WriteRankFile) and publishes its manifest
//      entry, or its error, in the job's Store under `ckpt/<S>/rank/<r>`;
//   3. rank 0 waits for every entry, writes the manifest, records the checkpoint complete, then
//      removes checkpoints beyond keep_last (oldest first, only ones older than S, each recorded
//      as removed), and publishes the outcome under `ckpt/<S>/done`;
//   4. the other ranks wait for `ckpt/<S>/done`, so Save returns on every rank once the
//      checkpoint is complete (or with the same error everywhere).
// Before step 2 rank 0 publishes `ckpt/<S>/start` (OK, or why the save cannot be made, e.g. step
// S is already complete there), so no rank overwrites the files of a complete checkpoint. A rank
// that fails also sets `done` to its error at once, so nobody waits for the timeout. Each key has
// the call's number after `<S>` (`ckpt/<S>/<n>/...`, n counting each rank's Save and Load calls,
// the same on every rank by the SPMD contract), so a second save of step S (after loading an
// older checkpoint) never reads the first one's keys. Load publishes rank 0's choice under
// `ckpt/load/<n>`, each rank's check of it under `ckpt/load/<n>/rank/<r>` and, after reading its
// part, its verdict under `ckpt/load/<n>/read/<r>`: all learn every failure before the collective
// that rebuilds the parameters.
// Rank 0 lists each call's keys under `ckpt/keys/<n>` and deletes call n-1's once every rank has
// reached call n's rendezvous (nobody reads them any more), so a job that snapshots every step
// keeps a few keys in its store, not world + 2 per save.
// A crash at any moment leaves the previous complete checkpoint as it was; the new directory
// has no manifest (partial) or the coordinator's record still says saving.
//
// Load: the newest complete checkpoint under a root (or one given directory), resharded to the
// engine's world and stage. Which directories of a root count goes by this job's records
// (internal/selection.h): with a Recorder, a checkpoint the coordinator recorded complete there
// for this job (its manifest the one recorded), or, in the snapshot root alone, an in-memory
// snapshot of this job (not recorded, its manifest names the job); without one (no coordinator:
// a test, a tool) the root is the job's own and every complete checkpoint in it counts. Another
// job's checkpoint loads only when its directory is named. A link named like a step, a partial
// save, a checkpoint the records do not list are skipped with the reason.
//
// A damaged one (a checksum that does not match, a missing or truncated file, a manifest that was
// replaced: internal/damage.h) is skipped only once rank 0 has found the damage itself (in its
// vetting, its own read, or by verifying the whole checkpoint when another rank reported it):
// rank 0 sets it aside (`step-N.damaged-<ms>`, recorded set aside) and every rank loads the next
// newest instead, so a restart falls back to the newest intact checkpoint; rank 0 logs what it
// skipped and why. Any other failure (a directory one rank cannot see, a file the manifest does
// not list, a permission, a store error, damage rank 0 does not find) fails the load on every
// rank and touches nothing. When nothing is left to load but the job's records list checkpoints
// under the roots (damaged, missing, refused), the load fails naming them instead of starting
// afresh. A directory named explicitly loads or fails, never falls back.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/comm/store.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::checkpoint {

// kSetAside: a complete checkpoint a load found damaged (or gone) and fell back past; the step
// may be saved again, and the directory, put back in place, is checked again.
enum class RecordState { kSaving, kComplete, kRemoved, kSetAside };

struct CheckpointRecordInfo {
  int64_t step = 0;
  std::string directory;  // absolute
  int64_t world_size = 0;
  int stage = 0;
  RecordState state = RecordState::kSaving;
  int64_t bytes = 0;
  uint64_t manifest_xxh3 = 0;  // with kComplete: the manifest's checksum (0: not known)
};

// The coordinator's durable record of a job's checkpoints (the session implements it over gRPC;
// runtime/ knows no gRPC). Called on rank 0 only.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual absl::Status Record(const CheckpointRecordInfo& record) = 0;
  virtual absl::StatusOr<std::vector<CheckpointRecordInfo>> List() = 0;
  // The job whose records these are: an unrecorded snapshot counts only when its manifest names it.
  virtual const std::string& job_id() const = 0;
};

struct SaveOptions {
  std::string root;       // checkpoints go to StepDirectory(root, step); created if missing
  int64_t keep_last = 0;  // 0: keep every checkpoint
  std::string user;       // rank 0's goes into the manifest (e.g. the data loader position)
  std::string extra;      // this rank's own bytes (e.g. module buffers)
  std::string job_id;     // for the manifest
  // false: the recorder is not told (an in-memory snapshot, which does not outlive the node: the
  // coordinator's records list durable checkpoints only). Such a checkpoint is complete when its
  // manifest is in place; a load takes it from ResumeRoots::snapshots or when named.
  bool record = true;
  // How long a rank waits for the others: for rank 0's start, and from the end of its own write
  // for their files and the outcome (a slow disk is no timeout; a rank that never comes is).
  absl::Duration timeout = absl::Minutes(10);
};

struct SavedCheckpoint {
  int64_t step = 0;
  std::string directory;
  int64_t bytes = 0;  // all ranks' files together
};

// `store` is the job's Store (the session's, prefixed by generation); `recorder` may be null.
absl::StatusOr<SavedCheckpoint> Save(engine::ZeroEngine& engine, comm::Store& store,
                                     Recorder* recorder, const SaveOptions& options);

struct LoadedCheckpoint {
  int64_t step = 0;
  std::string directory;
  Manifest manifest;
  std::string extra;  // this rank's (ReadExtra)
  // This rank's reading of the files (LoadState), without the agreement between ranks and the
  // rebuilding of the parameters that follow: what the disk's bandwidth bounds.
  absl::Duration read_time;
};

// The newest complete checkpoint under `root`, or NOT_FOUND naming the root (and the partial ones
// it skipped). With a recorder, its complete records decide which directories count.
absl::StatusOr<std::string> LatestComplete(const std::string& root, Recorder* recorder);

// Where a restarted trainer resumes from: the job's in-memory snapshots (unrecorded: zerorun's
// $ZEROD_SNAPSHOT_DIR, a directory of this user's alone) and its durable checkpoint roots. Either
// may be empty.
struct ResumeRoots {
  std::string snapshots;
  std::vector<std::string> durable;
};

// The newest complete checkpoint among the roots (the snapshots win a tie: read from memory),
// loaded as LoadIfAny loads one; nullopt on every rank when no root holds one and the job's
// records list none there. Rank 0 decides with `recorder`, so "complete" means here what it means
// to Load. Unrecorded snapshots count in `roots.snapshots` alone.
absl::StatusOr<std::optional<LoadedCheckpoint>> LoadNewestIfAny(
    engine::ZeroEngine& engine, comm::Store& store, const ResumeRoots& roots, Recorder* recorder,
    absl::Duration timeout = absl::Minutes(10));

// Loads `path`: a checkpoint directory, or a root whose newest complete checkpoint is taken.
// Every rank calls it (Restore is a collective). A failed load (every rank returns the error) may
// have written part of the state: load again before training on. Rank 0 chooses the directory
// and publishes its choice in `store`, so every rank loads the same checkpoint even if one is
// completed meanwhile.
absl::StatusOr<LoadedCheckpoint> Load(engine::ZeroEngine& engine, comm::Store& store,
                                      const std::string& path, Recorder* recorder,
                                      absl::Duration timeout = absl::Minutes(10));

// Load for a trainer that resumes when it can: nullopt on every rank when `path` is a root (or a
// missing directory) holding no complete checkpoint yet, the first run; any other problem is an
// error, as in Load.
absl::StatusOr<std::optional<LoadedCheckpoint>> LoadIfAny(
    engine::ZeroEngine& engine, comm::Store& store, const std::string& path, Recorder* recorder,
    absl::Duration timeout = absl::Minutes(10));

// Failure injection, for tests of a rank whose node sees a shared filesystem otherwise (not
// mounted there, or a stale copy): when set, each rank reads the directory the hook returns for
// rank 0's choice `dir` instead of `dir`. Process-wide; nullptr, the default, reads `dir`.
using LoadViewInjection = std::string (*)(int64_t rank, const std::string& dir);
void SetLoadViewInjectionForTesting(LoadViewInjection hook);

}  // namespace zerod::checkpoint

#endif  // ZEROD_RUNTIME_CHECKPOINT_SAVE_PROTOCOL_H_
