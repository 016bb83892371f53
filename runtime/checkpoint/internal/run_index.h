#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_RUN_INDEX_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_RUN_INDEX_H_

// Which rank files hold a range of model elements, and where in their sections: the runs of all
// files sorted by model offset (a manifest that parsed covers the model exactly once), searched
// by binary search.

#include <cstdint>
#include <vector>

#include "runtime/checkpoint/checkpoint_files.h"

namespace zerod::checkpoint::internal {

// Elements [model_offset, model_offset + numel) sit in file `file` (an index into
// manifest.files) from element `element` of each of its sections.
struct FilePiece {
  int64_t file = 0;
  int64_t element = 0;
  int64_t model_offset = 0;
  int64_t numel = 0;
};

class RunIndex {
 public:
  explicit RunIndex(const Manifest& manifest);
  // The pieces of `run`, in model order; they cover it exactly once when the run lies inside the
  // model.
  std::vector<FilePiece> Find(const engine::ModelRun& run) const;

 private:
  std::vector<FilePiece> runs_;  // one per run of every file, by model_offset
};

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_RUN_INDEX_H_
