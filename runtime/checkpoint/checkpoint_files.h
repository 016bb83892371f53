#ifndef ZEROD_RUNTIME_CHECKPOINT_CHECKPOINT_FILES_H_
#define ZEROD_RUNTIME_CHECKPOINT_CHECKPOINT_FILES_H_

// The files of one sharded checkpoint, and nothing about who waits for whom (that is
// save_protocol.h). No gRPC here: runtime/ links none.
//
// A checkpoint of step S is a directory `<root>/step-<S, 12 digits>/` holding:
//   rank-<r, 5 digits>.shard  one per saving rank: three sections of n fp32 values each (master,
//                             Adam m, Adam v) for the rank's saved runs in model order
//                             (ZeroEngine::SavedRuns), then `extra` bytes of the trainer's own
//                             (the front end's module buffers; may be empty)
//   manifest.json             written last, by rank 0, once every rank's file is in place
// Model coordinates (ModelRun) are the same whatever the plan, which is what lets any world size
// and any stage read any checkpoint: a rank reads, from each old file, exactly the byte ranges
// whose runs overlap the elements it holds now.
//
// Every file is written under a fresh name beside its own (`<name>.XXXXXX.tmp`), fsync'd, renamed,
// and the directory fsync'd, so a crash leaves either the old name or the whole new file; files
// go only into a step directory that is itself a directory, never through a link put in its place
// (runtime/common/safe_file.h). A directory without manifest.json is a partial checkpoint and is
// never loaded. The manifest lists, per rank file, its size, an XXH3-64 of the whole file and one
// per kChecksumBlockBytes block, so that a loader that reads a range verifies only the blocks it
// reads, and `Verify` checks everything; the manifest's own bytes are covered by its
// `manifest_xxh3` (format 2). A checkpoint directory holds nothing else: a file its manifest does
// not list is refused, as is a step directory that is a link or whose name is another step's.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/plan/plan_input.h"

namespace zerod::checkpoint {

// 2: the manifest carries its own checksum. Format 1 is read only by UpgradeManifest.
inline constexpr int kFormatVersion = 2;
inline constexpr int64_t kChecksumBlockBytes = int64_t{4} << 20;
inline constexpr char kManifestName[] = "manifest.json";

// `<root>/step-<step, 12 digits>`.
std::string StepDirectory(const std::string& root, int64_t step);
// The step of a directory named as StepDirectory names one (`step-` and 12 digits), or -1.
int64_t StepOfDirectoryName(const std::string& name);
// `rank-<rank, 5 digits>.shard`.
std::string RankFileName(int64_t rank);

// One rank's file as the manifest lists it.
struct RankFile {
  int64_t rank = 0;
  std::string name;                    // relative to the checkpoint directory
  std::vector<engine::ModelRun> runs;  // model order; each section holds their elements in order
  int64_t numel = 0;                   // sum of runs' numel: each section is numel * 4 bytes
  int64_t extra_bytes = 0;             // after the three sections
  int64_t bytes = 0;                   // the whole file: 12 * numel + extra_bytes
  uint64_t xxh3 = 0;                   // of the whole file
  std::vector<uint64_t> block_xxh3;    // of each kChecksumBlockBytes block (the last one shorter)
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string job_id;
  int64_t step = 0;  // counters.steps_taken: the directory's name
  engine::TrainingCounters counters;
  int64_t world_size = 0;  // of the run that saved it
  int stage = 0;
  DType param_dtype = DType::kBFloat16;
  DType grad_dtype = DType::kBFloat16;
  std::vector<plan::TensorSpec> layout;  // the model's tensors, in model order
  std::string layout_digest;             // plan::DigestHex(plan::LayoutDigest(layout))
  std::string plan_digest;               // of the plan that saved it (information only)
  int64_t total_numel = 0;
  std::vector<RankFile> files;  // one per rank of the saving world, by rank
  std::string user;             // the trainer's own (e.g. its data loader position), opaque here
  int64_t created_unix_ms = 0;
  // Whether the coordinator recorded the save (false: an in-memory snapshot, SaveOptions::record).
  bool recorded = true;
  // The manifest's own checksum as read (ManifestFromJson fills it; writing computes it afresh).
  uint64_t manifest_xxh3 = 0;
};

std::string ManifestToJson(const Manifest& manifest);
// INVALID_ARGUMENT / DATA_LOSS naming `source` (a path) and the field at fault.
absl::StatusOr<Manifest> ManifestFromJson(const std::string& json, const std::string& source);

// Writes this rank's file into `dir` (which must exist): the engine's saved runs of the three
// state tensors, then `extra`. Returns its manifest entry. Large sequential writes; the engine's
// state is read in bounded chunks, never whole on the host at once. Errors (a full disk
// included: RESOURCE_EXHAUSTED) name the file; a failed write leaves no file under the final name.
absl::StatusOr<RankFile> WriteRankFile(const std::string& dir, engine::ZeroEngine& engine,
                                       const std::string& extra);

// Failure injection, for tests of a crash or an error in the middle of a save: when set, called
// after every chunk a rank file gets, with the file's path and the bytes written to it so far
// (the file is still under its temporary name); an error it returns fails the write as a disk
// error would. Process-wide; nullptr, the default, does nothing.
using SaveFailureInjection = absl::Status (*)(const std::string& path, int64_t bytes_written);
void SetSaveFailureInjectionForTesting(SaveFailureInjection hook);

// Writes `manifest` as `dir`/manifest.json (tmp, fsync, rename, fsync dir): the checkpoint is
// complete on disk from here. Checks that `files` covers every element of the model exactly once.
absl::Status WriteManifest(const std::string& dir, const Manifest& manifest);

// NOT_FOUND naming the directory when it holds no manifest (a partial checkpoint says so:
// "... is partial: rank files but no manifest.json"); FAILED_PRECONDITION when `dir` is a symbolic
// link or its manifest is of format 1 (no checksum: UpgradeManifest); DATA_LOSS when the
// manifest's checksum does not match its bytes, or `dir` is named for another step than its
// manifest's ("step-000000000007 holds the checkpoint of step 1").
absl::StatusOr<Manifest> ReadManifest(const std::string& dir);

// The directory's entries against its manifest, without reading the rank files: every file it
// lists is a regular file of its size (NOT_FOUND "X is missing", DATA_LOSS "X is truncated ..."),
// and nothing else is there (DATA_LOSS "X is not listed in its manifest").
absl::Status CheckFiles(const std::string& dir, const Manifest& manifest);

// Gives a format-1 manifest (written before manifests had a checksum) its checksum, after checking
// every rank file against it as Verify does: the operator's way to vouch for an old checkpoint.
// OK and nothing changed when the manifest already has one; the old manifest stays as it was when
// anything is wrong.
absl::Status UpgradeManifest(const std::string& dir);

// Whether a checkpoint of `manifest` can be loaded by a run of `layout`: the same tensor names
// and shapes in the same order (dtypes may differ: the state is fp32). FAILED_PRECONDITION naming
// the first tensor that differs.
absl::Status CheckLayout(const Manifest& manifest, const std::vector<plan::TensorSpec>& layout,
                         const std::string& dir);

// Loads the checkpoint in `dir` into `engine`, whatever its world size and stage: for each run
// the engine holds (HeldRuns), reads the overlapping byte ranges of the old files, verifying the
// checksum of every block read, and writes them into the engine; then FinishRestore (a collective:
// every rank of the engine's world calls it). The loaded state equals the saved state bit for
// bit. Errors name the file and the problem (missing, truncated, checksum mismatch, other layout).
absl::Status Restore(const std::string& dir, const Manifest& manifest, engine::ZeroEngine& engine);

// Restore without its collective: checks the layout, then writes every element the engine holds
// from the files, and stops there. Restore is LoadState, then engine.FinishRestore(
// manifest.counters); a caller that must learn whether every rank read its part before entering
// the collective (so that one rank's damaged file does not leave the others waiting in it) calls
// the two itself.
absl::Status LoadState(const std::string& dir, const Manifest& manifest,
                       engine::ZeroEngine& engine);

// Rank `rank`'s extra bytes (checked), or rank 0's when the saving world had no such rank.
absl::StatusOr<std::string> ReadExtra(const std::string& dir, const Manifest& manifest,
                                      int64_t rank);

// Reads the manifest (ReadManifest's checks) and every file it lists, and checks sizes and
// checksums, that the runs cover the model exactly once and that nothing else is in the directory
// (CheckFiles). OK, or the first problem naming the file.
absl::Status Verify(const std::string& dir);

// The full fp32 parameters by tensor name as a safetensors file (dtype F32, the layout's shapes),
// streamed tensor by tensor from the rank files (checked), written to `out` via tmp + rename.
absl::Status ExportSafetensors(const std::string& dir, const std::string& out);

}  // namespace zerod::checkpoint

#endif  // ZEROD_RUNTIME_CHECKPOINT_CHECKPOINT_FILES_H_
