#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_CHECKED_FILES_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_CHECKED_FILES_H_

// Byte ranges of a checkpoint's rank files, read through their block checksums: a read is
// extended to whole kChecksumBlockBytes blocks, each block is checked against the manifest the
// first time it is read (once per file is enough), and a few recent blocks are kept, so reads
// that walk a file in order read each block once. Memory: `cached_blocks` blocks, whatever the
// model's size. Not thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/file_io.h"

namespace zerod::checkpoint::internal {

class CheckedFiles {
 public:
  CheckedFiles(std::string dir, const Manifest& manifest, int cached_blocks = 2);
  CheckedFiles(const CheckedFiles&) = delete;
  CheckedFiles& operator=(const CheckedFiles&) = delete;

  // Opens file `index` (of manifest.files) if it is not open and checks its size: NOT_FOUND
  // "X is missing", DATA_LOSS "X is truncated: N bytes, the manifest says M".
  absl::Status Open(int64_t index);
  // `bytes` bytes of file `index` from `offset`; DATA_LOSS naming the file and block when a
  // checksum differs.
  absl::Status Read(int64_t index, int64_t offset, int64_t bytes, char* out);
  // The first bytes of the same range that lie in one block, checked, without a copy: valid until
  // the next call. Never empty when `bytes` > 0; a block's start is 4 MiB-aligned in the file and
  // at least 16-byte aligned in memory, so fp32 values at 4-byte file offsets are aligned.
  absl::StatusOr<absl::string_view> ReadSome(int64_t index, int64_t offset, int64_t bytes);
  std::string PathOf(int64_t index) const;

 private:
  struct OpenFile {
    std::optional<ReadOnlyFile> file;
    std::vector<bool> verified;  // per block
  };
  struct CachedBlock {
    int64_t file = -1;
    int64_t block = -1;
    uint64_t last_use = 0;
    std::vector<char> data;
  };
  absl::StatusOr<const CachedBlock*> Block(int64_t index, int64_t block);

  const std::string dir_;
  const Manifest& manifest_;
  std::vector<OpenFile> files_;
  std::vector<CachedBlock> cache_;
  uint64_t uses_ = 0;
};

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_CHECKED_FILES_H_
