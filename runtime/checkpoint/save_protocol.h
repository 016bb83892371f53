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
// engine's world and stage. Which directories of a root count goes by the records
// (internal/selection.h): with a Recorder, a checkpoint the coordinator recorded complete there
// (its manifest the one recorded) for this job or for the job that saved it (an earlier run
// writing into the same root), or an in-memory snapshot of this job (not recorded, its manifest
// names the job); without one (no coordinator: a test, a tool) the root is the job's own and every
// complete checkpoint in it counts. A link named like a step, a partial save, a
// checkpoint of another job are skipped with the reason. A damaged one (a checksum that does not
// match, a missing or stray file) is skipped too: rank 0 sets it aside (`step-N.damaged-<ms>`,
// recorded removed) and every rank loads the next newest instead, so a restart falls back to the
// newest intact checkpoint; rank 0 logs what it skipped and why. When only damaged ones are left
// the load fails (DATA_LOSS naming each), never starts afresh. A directory named explicitly loads
// or fails, never falls back.

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

enum class RecordState { kSaving, kComplete, kRemoved };

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
  // Another job's records: a checkpoint that job saved in this job's root counts only where that
  // job recorded it, so that a later job resumes from an earlier one's root but not from a
  // checkpoint copied in.
  virtual absl::StatusOr<std::vector<CheckpointRecordInfo>> ListOf(const std::string& job_id) = 0;
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
  // manifest is in place, and Load takes it when given its directory or root explicitly.
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

// The newest complete checkpoint among several roots (an earlier root wins a tie: put the
// in-memory snapshots first), loaded as LoadIfAny loads one; nullopt on every rank when no root
// holds one. Rank 0 decides with `recorder`, so "complete" means here what it means to Load.
absl::StatusOr<std::optional<LoadedCheckpoint>> LoadNewestIfAny(
    engine::ZeroEngine& engine, comm::Store& store, const std::vector<std::string>& roots,
    Recorder* recorder, absl::Duration timeout = absl::Minutes(10));

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

}  // namespace zerod::checkpoint

#endif  // ZEROD_RUNTIME_CHECKPOINT_SAVE_PROTOCOL_H_
