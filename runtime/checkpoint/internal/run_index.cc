#include "runtime/checkpoint/internal/run_index.h"

#include <algorithm>

namespace zerod::checkpoint::internal {

RunIndex::RunIndex(const Manifest& manifest) {
  for (size_t f = 0; f < manifest.files.size(); ++f) {
    int64_t element = 0;
    for (const engine::ModelRun& r : manifest.files[f].runs) {
      runs_.push_back({static_cast<int64_t>(f), element, r.offset, r.numel});
      element += r.numel;
    }
  }
  std::sort(runs_.begin(), runs_.end(),
            [](const FilePiece& a, const FilePiece& b) { return a.model_offset < b.model_offset; });
}

std::vector<FilePiece> RunIndex::Find(const engine::ModelRun& run) const {
  std::vector<FilePiece> pieces;
  const int64_t end = run.offset + run.numel;
  // The first stored run that ends after run.offset.
  auto it = std::upper_bound(
      runs_.begin(), runs_.end(), run.offset,
      [](int64_t offset, const FilePiece& p) { return offset < p.model_offset + p.numel; });
  for (; it != runs_.end() && it->model_offset < end; ++it) {
    const int64_t lo = std::max(run.offset, it->model_offset);
    const int64_t hi = std::min(end, it->model_offset + it->numel);
    pieces.push_back({it->file, it->element + (lo - it->model_offset), lo, hi - lo});
  }
  return pieces;
}

}  // namespace zerod::checkpoint::internal
