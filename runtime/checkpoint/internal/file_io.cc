#include "runtime/checkpoint/internal/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zerod::checkpoint::internal {

absl::Status FileError(int error, const std::string& what, const std::string& path) {
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error));
  switch (error) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(absl::StrCat(
          path, ": ", what, ": no space left on the device (", std::strerror(error), ")"));
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<AtomicFile> AtomicFile::Create(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, "cannot create", tmp);
  return AtomicFile(path, fd);
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), written_(other.written_) {}

AtomicFile::~AtomicFile() { Discard(); }

void AtomicFile::Discard() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink((path_ + ".tmp").c_str());
}

absl::Status AtomicFile::Append(const char* data, int64_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, data, static_cast<size_t>(bytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      Discard();
      return FileError(error, "write failed", path_);
    }
    data += n;
    bytes -= n;
    written_ += n;
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  const std::string tmp = path_ + ".tmp";
  if (::fsync(fd_) != 0) {
    const int error = errno;
    Discard();
    return FileError(error, "fsync failed", path_);
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return FileError(error, "close failed", path_);
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return FileError(error, "rename failed", path_);
  }
  std::string dir = std::filesystem::path(path_).parent_path().string();
  return SyncDirectory(dir.empty() ? "." : dir);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  auto file = AtomicFile::Create(path);
  if (!file.ok()) return file.status();
  absl::Status s = file->Append(contents);
  if (!s.ok()) return s;
  return file->Commit();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "cannot open directory", dir);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some filesystems cannot fsync a directory (EINVAL); their renames are as durable as they get.
  if (rc != 0 && error != EINVAL) return FileError(error, "fsync of the directory failed", dir);
  return absl::OkStatus();
}

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, " is missing"));
    return FileError(error, "cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return FileError(error, "cannot stat", path);
  }
  return ReadOnlyFile(path, fd, static_cast<int64_t>(st.st_size));
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ReadOnlyFile::ReadAt(int64_t offset, int64_t bytes, char* out) const {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, out, static_cast<size_t>(bytes), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, absl::StrCat("read at byte ", offset, " failed"), path_);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path_, " is truncated: it ends at byte ", offset,
                                              ", ", bytes, " bytes short of what was to be read"));
    }
    out += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  auto file = ReadOnlyFile::Open(path);
  if (!file.ok()) return file.status();
  // A manifest is read whole: one that claims more than any checkpoint needs (its block
  // checksums of 12 TB of state come to about 60 MB) is not allocated.
  constexpr int64_t kMaxWholeFileBytes = int64_t{1} << 30;
  if (file->size() > kMaxWholeFileBytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", file->size(), " bytes, more than the ",
                                            kMaxWholeFileBytes, " a manifest may be"));
  }
  std::string contents(static_cast<size_t>(file->size()), '\0');
  absl::Status s = file->ReadAt(0, file->size(), contents.data());
  if (!s.ok()) return s;
  return contents;
}

}  // namespace zerod::checkpoint::internal
