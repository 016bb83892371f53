#include "runtime/checkpoint/internal/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/common/safe_file.h"

namespace zerod::checkpoint::internal {

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  // A link, a FIFO or a device put in a checkpoint directory is refused, never read as a file.
  absl::StatusOr<int> fd = OpenRegularFile(path, O_RDONLY);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(*fd, &st) != 0) {
    const int error = errno;
    ::close(*fd);
    return FileError(error, "cannot stat", path);
  }
  return ReadOnlyFile(path, *fd, static_cast<int64_t>(st.st_size));
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
      return Damage(
          absl::DataLossError(absl::StrCat(path_, " is truncated: it ends at byte ", offset, ", ",
                                           bytes, " bytes short of what was to be read")));
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
