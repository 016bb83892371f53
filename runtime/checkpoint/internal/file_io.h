#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_FILE_IO_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_FILE_IO_H_

// POSIX file I/O for checkpoints: a file written under `<name>.tmp` and renamed into place only
// once it is whole and on disk, and positioned reads. Every loop handles EINTR and short
// transfers; every error names the file. A full disk (ENOSPC, EDQUOT) is RESOURCE_EXHAUSTED.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod::checkpoint::internal {

// The status for a failed system call on `path` (errno `error`): RESOURCE_EXHAUSTED for a full
// disk or quota, NOT_FOUND for a missing file, else INTERNAL.
absl::Status FileError(int error, const std::string& what, const std::string& path);

// A file being written as `path`.tmp. Commit() fsyncs it, renames it to `path` and fsyncs the
// directory; a file never committed (an error, a destructor) is removed, so a failed write leaves
// nothing under either name.
class AtomicFile {
 public:
  static absl::StatusOr<AtomicFile> Create(const std::string& path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();

  absl::Status Append(const char* data, int64_t bytes);
  absl::Status Append(absl::string_view data) {
    return Append(data.data(), static_cast<int64_t>(data.size()));
  }
  absl::Status Commit();
  int64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  AtomicFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void Discard();

  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0;
};

// Writes `contents` to `path` through AtomicFile.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// fsync of a directory, so that a rename inside it survives a crash.
absl::Status SyncDirectory(const std::string& dir);

// A file opened for positioned reads.
class ReadOnlyFile {
 public:
  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path);
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly `bytes` from `offset`; DATA_LOSS naming the file when it ends first.
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
