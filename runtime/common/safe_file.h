#ifndef ZEROD_RUNTIME_COMMON_SAFE_FILE_H_
#define ZEROD_RUNTIME_COMMON_SAFE_FILE_H_

// Files written where a user points (an export's --out, a port file, a log, a checkpoint's files):
// regular files only. A file is written under a fresh name beside its target (O_EXCL, so never
// through whatever was planted there) and renamed over the target once whole and on disk; a target
// that is anything but a regular file (a symbolic link, a device, a FIFO, a socket, a directory) is
// refused, before and again at the rename, and left as it was. The target's parent directories
// are followed as the path names them; only its last component is never followed.
//
// Every loop handles EINTR and short writes; every error names the file. A full disk (ENOSPC,
// EDQUOT) is RESOURCE_EXHAUSTED; a target that is not a regular file is FAILED_PRECONDITION.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod {

// Where the symbolic link `name` in directory `dir_fd` points, for a message ("?" when that
// cannot be read). LinkTarget(path) reads `path` itself.
std::string LinkTargetAt(int dir_fd, const std::string& name);
std::string LinkTarget(const std::string& path);

// `path` without trailing slashes ("/" stays): lstat of "link/" would follow the link.
std::string WithoutTrailingSlashes(std::string path);

// The status for a failed system call on `path` (errno `error`): RESOURCE_EXHAUSTED for a full
// disk or quota, NOT_FOUND for a missing file, PERMISSION_DENIED, else INTERNAL.
absl::Status FileError(int error, const std::string& what, const std::string& path);

// OK when nothing is at `path` or a regular file is; else FAILED_PRECONDITION "<path> is a FIFO,
// not a regular file: refusing to write to it" (a symbolic link: "... (to <where>): refusing to
// write through it"). Looks at `path` itself, never at what a link there points to. A path that
// ends in '/' names a directory: INVALID_ARGUMENT.
absl::Status CheckRegularFileTarget(const std::string& path);

struct SafeWriteOptions {
  // Of a new file, less the umask. A file that replaces a regular file keeps that file's mode, so
  // that a file made readable by its owner alone stays so.
  mode_t mode = 0644;
  // Refuse a target whose parent directory is itself a symbolic link (a checkpoint's step
  // directory, which the saver made and must not have been swapped for a link).
  bool parent_must_not_be_link = false;
};

// A file being written beside `path` (as `<name>.XXXXXX.tmp`, a name nobody had). Commit() fsyncs
// it, renames it over `path` and fsyncs the directory; a file never committed (an error, the
// destructor) is removed, so a failed write leaves nothing under either name and the target as it
// was.
class AtomicFileWriter {
 public:
  // CheckRegularFileTarget(path) first.
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path,
                                                 const SafeWriteOptions& options = {});
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const char* data, int64_t bytes);
  absl::Status Append(absl::string_view data) {
    return Append(data.data(), static_cast<int64_t>(data.size()));
  }
  absl::Status Commit();
  int64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }
  // The temporary file's path, while it is being written.
  std::string temp_path() const;

 private:
  AtomicFileWriter(std::string path, int dir_fd, std::string temp_name, int fd)
      : path_(std::move(path)), dir_fd_(dir_fd), temp_name_(std::move(temp_name)), fd_(fd) {}
  void Discard();

  std::string path_;
  int dir_fd_ = -1;        // the target's directory: every name below is relative to it
  std::string temp_name_;  // the temporary file's name in it
  int fd_ = -1;
  int64_t written_ = 0;
};

// Writes `contents` to `path` through AtomicFileWriter.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const SafeWriteOptions& options = {});

// Opens `path` with `flags` (O_RDONLY; or O_WRONLY, O_APPEND, O_CREAT with `mode`) when it is a
// regular file: never through a link in its last component, never waiting on a FIFO. NOT_FOUND
// "<path> is missing"; FAILED_PRECONDITION naming what is there when it is not a regular file.
// The descriptor (blocking, close-on-exec) is the caller's to close.
absl::StatusOr<int> OpenRegularFile(const std::string& path, int flags, mode_t mode = 0);

// Opens `path` to append to it (a log that is reopened, never replaced), creating a regular file
// with `mode` (less the umask) if nothing is there. Refused as CheckRegularFileTarget refuses,
// before anything is opened (opening a device can act on it: a tape rewinds).
absl::StatusOr<int> OpenRegularFileForAppend(const std::string& path, mode_t mode);

// fsync of a directory, so that a rename inside it survives a crash. A filesystem that cannot
// fsync a directory (EINVAL) makes its renames as durable as they get: OK.
absl::Status SyncDirectory(const std::string& dir);

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_SAFE_FILE_H_
