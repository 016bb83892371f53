#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_FILE_IO_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_FILE_IO_H_

// Reading a checkpoint's files: positioned reads of regular files only (a link, a FIFO or a
// device in a checkpoint directory is refused, never followed or waited on). Every loop handles
// EINTR and short transfers; every error names the file. Writing goes through
// runtime/common/safe_file.h.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod::checkpoint::internal {

// A file opened for positioned reads.
class ReadOnlyFile {
 public:
  // NOT_FOUND "X is missing"; FAILED_PRECONDITION when X is not a regular file (a symbolic link
  // included).
  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path);
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly `bytes` from `offset`; DATA_LOSS naming the file when it ends first (damage).
  absl::Status ReadAt(int64_t offset, int64_t bytes, char* out) const;

 private:
  ReadOnlyFile(std::string path, int fd, int64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// A small file (a manifest) whole; DATA_LOSS for one over 1 GiB, which no manifest needs.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_FILE_IO_H_
