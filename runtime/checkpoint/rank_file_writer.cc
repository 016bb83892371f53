// Writing a checkpoint: each rank's file (WriteRankFile), then rank 0's manifest (WriteManifest).

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/checksums.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint {
namespace {

static_assert(std::endian::native == std::endian::little,
              "rank files hold little-endian fp32, written as the host holds it");

// The host buffer the engine's state passes through on its way to the file: large enough for
// sequential I/O, small enough that a stage-0 rank holding the whole model never copies it whole.
constexpr int64_t kChunkNumel = int64_t{2} << 20;  // 8 MiB of fp32

std::atomic<SaveFailureInjection> failure_injection{nullptr};

// A checkpoint's files go only into the step directory the save made, never through a link put
// in its place.
SafeWriteOptions InStepDirectory() {
  SafeWriteOptions options;
  options.parent_must_not_be_link = true;
  return options;
}

}  // namespace

void SetSaveFailureInjectionForTesting(SaveFailureInjection hook) { failure_injection = hook; }

absl::StatusOr<RankFile> WriteRankFile(const std::string& dir, engine::ZeroEngine& engine,
                                       const std::string& extra) {
  RankFile f;
  f.rank = engine.rank();
  f.name = RankFileName(f.rank);
  f.runs = engine.SavedRuns();
  for (const engine::ModelRun& r : f.runs) f.numel += r.numel;
  f.extra_bytes = static_cast<int64_t>(extra.size());
  f.bytes = 12 * f.numel + f.extra_bytes;
  const std::string path = absl::StrCat(dir, "/", f.name);

  ZEROD_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(path, InStepDirectory()));
  internal::FileHasher hasher(kChecksumBlockBytes);
  std::vector<float> chunk(
      static_cast<size_t>(std::min(kChunkNumel, std::max<int64_t>(f.numel, 1))));
  const int64_t capacity = static_cast<int64_t>(chunk.size());
  int64_t filled = 0;
  auto flush = [&]() -> absl::Status {
    const char* bytes = reinterpret_cast<const char*>(chunk.data());
    hasher.Update(bytes, filled * 4);
    ZEROD_RETURN_IF_ERROR(file.Append(bytes, filled * 4));
    filled = 0;
    if (SaveFailureInjection hook = failure_injection.load()) {
      ZEROD_RETURN_IF_ERROR(hook(path, file.bytes_written()));
    }
    return absl::OkStatus();
  };
  for (int s = 0; s < engine::kStateTensorCount; ++s) {
    for (const engine::ModelRun& run : f.runs) {
      for (int64_t at = 0; at < run.numel;) {
        const int64_t n = std::min(run.numel - at, capacity - filled);
        absl::Status read = engine.ReadState(static_cast<engine::StateTensor>(s),
                                             {run.offset + at, n}, chunk.data() + filled);
        if (!read.ok()) {
          return absl::Status(read.code(), absl::StrCat(path, ": ", read.message()));
        }
        filled += n;
        at += n;
        if (filled == capacity) ZEROD_RETURN_IF_ERROR(flush());
      }
    }
  }
  ZEROD_RETURN_IF_ERROR(flush());
  hasher.Update(extra.data(), f.extra_bytes);
  ZEROD_RETURN_IF_ERROR(file.Append(extra));
  hasher.Finish();
  if (file.bytes_written() != f.bytes) {
    return absl::InternalError(absl::StrCat(path, ": wrote ", file.bytes_written(), " bytes where ",
                                            f.bytes, " were due"));
  }
  ZEROD_RETURN_IF_ERROR(file.Commit());
  f.xxh3 = hasher.whole();
  f.block_xxh3 = hasher.blocks();
  return f;
}

absl::Status WriteManifest(const std::string& dir, const Manifest& manifest) {
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  ZEROD_RETURN_IF_ERROR(internal::CheckManifest(manifest, path));
  // A manifest makes the checkpoint complete: never write one that lists a file not in place.
  for (const RankFile& f : manifest.files) {
    const std::string file = absl::StrCat(dir, "/", f.name);
    struct stat st;
    if (::stat(file.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(file, " is missing: the manifest would list it"));
    }
    if (st.st_size != f.bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, " holds ", st.st_size, " bytes where its manifest entry says ", f.bytes));
    }
  }
  return WriteFileAtomically(path, ManifestToJson(manifest), InStepDirectory());
}

}  // namespace zerod::checkpoint
