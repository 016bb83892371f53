// Loading a checkpoint into an engine of any world size and stage: each rank reads, from each old
// file, the byte ranges that hold the elements it holds now.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/checked_files.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/checkpoint/internal/run_index.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint {

absl::Status LoadState(const std::string& dir, const Manifest& manifest,
                       engine::ZeroEngine& engine) {
  ZEROD_RETURN_IF_ERROR(CheckLayout(manifest, engine.plan().tensors(), dir));
  const internal::RunIndex index(manifest);
  std::vector<internal::FilePiece> pieces;
  int64_t held = 0, found = 0;
  for (const engine::ModelRun& run : engine.HeldRuns()) {
    held += run.numel;
    for (const internal::FilePiece& p : index.Find(run)) {
      pieces.push_back(p);
      found += p.numel;
    }
  }
  if (found != held) {  // only a manifest that did not come from ReadManifest can get here
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": its files hold ", found,
                                            " of the ", held, " elements rank ", engine.rank(),
                                            " needs"));
  }
  // File by file, each in file order: reads go forward through every file.
  std::sort(pieces.begin(), pieces.end(),
            [](const internal::FilePiece& a, const internal::FilePiece& b) {
              return a.file != b.file ? a.file < b.file : a.element < b.element;
            });
  internal::CheckedFiles files(dir, manifest);
  // Every file this rank needs is there at its full size before the engine changes.
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i == 0 || pieces[i].file != pieces[i - 1].file) {
      ZEROD_RETURN_IF_ERROR(files.Open(pieces[i].file));
    }
  }
  for (size_t first = 0; first < pieces.size();) {
    size_t last = first;
    while (last < pieces.size() && pieces[last].file == pieces[first].file) ++last;
    const RankFile& file = manifest.files[static_cast<size_t>(pieces[first].file)];
    for (int s = 0; s < engine::kStateTensorCount; ++s) {
      for (size_t i = first; i < last; ++i) {
        const internal::FilePiece& p = pieces[i];
        // Straight from the checked block into the engine: no copy in between.
        for (int64_t at = 0; at < p.numel;) {
          ZEROD_ASSIGN_OR_RETURN(
              absl::string_view part,
              files.ReadSome(p.file, internal::SectionByteOffset(file, s, p.element + at),
                             (p.numel - at) * 4));
          const int64_t n = static_cast<int64_t>(part.size()) / 4;
          ZEROD_RETURN_IF_ERROR(engine.WriteState(static_cast<engine::StateTensor>(s),
                                                  {p.model_offset + at, n},
                                                  reinterpret_cast<const float*>(part.data())));
          at += n;
        }
      }
    }
    first = last;
  }
  return absl::OkStatus();
}

absl::Status Restore(const std::string& dir, const Manifest& manifest, engine::ZeroEngine& engine) {
  ZEROD_RETURN_IF_ERROR(LoadState(dir, manifest, engine));
  return engine.FinishRestore(manifest.counters);
}

absl::StatusOr<std::string> ReadExtra(const std::string& dir, const Manifest& manifest,
                                      int64_t rank) {
  const int64_t index = rank >= 0 && rank < static_cast<int64_t>(manifest.files.size()) ? rank : 0;
  if (manifest.files.empty()) return std::string();
  const RankFile& file = manifest.files[static_cast<size_t>(index)];
  internal::CheckedFiles files(dir, manifest, 1);
  // The file is there at the manifest's size before anything as large as it says is allocated.
  ZEROD_RETURN_IF_ERROR(files.Open(index));
  std::string extra(static_cast<size_t>(file.extra_bytes), '\0');
  ZEROD_RETURN_IF_ERROR(files.Read(index, 12 * file.numel, file.extra_bytes, extra.data()));
  return extra;
}

}  // namespace zerod::checkpoint
