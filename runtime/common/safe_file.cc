#include "runtime/common/safe_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zerod {
namespace {

// What is at a path, in words, for a message.
const char* KindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The refusal for `path`, which holds `mode` (not a regular file), to write it (or to read it).
// `dir_fd` and `name` read a link's target for the message.
absl::Status NotRegular(const std::string& path, mode_t mode, int dir_fd, const std::string& name,
                        bool writing = true) {
  if (S_ISLNK(mode)) {
    char target[512];
    const ssize_t n = ::readlinkat(dir_fd, name.c_str(), target, sizeof(target) - 1);
    const std::string to = n > 0 ? absl::StrCat(" (to ", std::string(target, n), ")") : "";
    return absl::FailedPreconditionError(absl::StrCat(path, " is a symbolic link", to,
                                                      ": refusing to ", writing ? "write" : "read",
                                                      " through it"));
  }
  return absl::FailedPreconditionError(absl::StrCat(path, " is ", KindOf(mode),
                                                    ", not a regular file: refusing to ",
                                                    writing ? "write to" : "read", " it"));
}

// `name` in `dir_fd`: OK when absent or a regular file.
absl::Status CheckAt(int dir_fd, const std::string& name, const std::string& path) {
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return FileError(errno, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode, dir_fd, name);
  return absl::OkStatus();
}

// `path` split into its directory ("." when none) and its last component.
std::pair<std::string, std::string> Split(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  if (slash == std::string::npos) return {".", trimmed};
  return {slash == 0 ? "/" : trimmed.substr(0, slash), trimmed.substr(slash + 1)};
}

// Six random characters from [A-Za-z0-9]: the part of a temporary name nobody can guess.
std::string RandomSuffix() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[6];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  std::string out;
  for (unsigned char b : bytes) out += kAlphabet[b % (sizeof(kAlphabet) - 1)];
  return out;
}

}  // namespace

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

absl::Status CheckRegularFileTarget(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("no file named (an empty path)");
  return CheckAt(AT_FDCWD, path, path);
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path,
                                                          const SafeWriteOptions& options) {
  if (path.empty()) return absl::InvalidArgumentError("no file named (an empty path)");
  const auto [dir, name] = Split(path);
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(path, " names a directory, not a file"));
  }
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC |
                                             (options.parent_must_not_be_link ? O_NOFOLLOW : 0));
  if (dir_fd < 0) {
    const int error = errno;
    struct stat st;
    if (options.parent_must_not_be_link && (error == ELOOP || error == ENOTDIR) &&
        ::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " is a symbolic link: refusing to write ", name, " through it"));
    }
    return FileError(error, absl::StrCat("cannot open its directory ", dir), path);
  }
  if (absl::Status s = CheckAt(dir_fd, name, path); !s.ok()) {
    ::close(dir_fd);
    return s;
  }
  // O_EXCL with a fresh name: never a file (or link) someone put there first.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string temp = absl::StrCat(name, ".", RandomSuffix(), ".tmp");
    const int fd = ::openat(dir_fd, temp.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, options.mode);
    if (fd >= 0) return AtomicFileWriter(path, dir_fd, std::move(temp), fd);
    if (errno != EEXIST) {
      const int error = errno;
      ::close(dir_fd);
      return FileError(error, "cannot create", absl::StrCat(dir, "/", temp));
    }
  }
  ::close(dir_fd);
  return absl::InternalError(absl::StrCat(path, ": no free temporary name beside it"));
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      dir_fd_(std::exchange(other.dir_fd_, -1)),
      temp_name_(std::move(other.temp_name_)),
      fd_(std::exchange(other.fd_, -1)),
      written_(other.written_) {}

AtomicFileWriter::~AtomicFileWriter() {
  Discard();
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

std::string AtomicFileWriter::temp_path() const {
  return absl::StrCat(Split(path_).first, "/", temp_name_);
}

void AtomicFileWriter::Discard() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
}

absl::Status AtomicFileWriter::Append(const char* data, int64_t bytes) {
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

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  if (::fsync(fd_) != 0) {
    const int error = errno;
    Discard();
    return FileError(error, "fsync failed", path_);
  }
  const std::string name = Split(path_).second;
  // What is at the target now (it may have changed while the file was written).
  if (absl::Status s = CheckAt(dir_fd_, name, path_); !s.ok()) {
    Discard();
    return s;
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
    return FileError(error, "close failed", path_);
  }
  if (::renameat(dir_fd_, temp_name_.c_str(), dir_fd_, name.c_str()) != 0) {
    const int error = errno;
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
    return FileError(error, "rename failed", path_);
  }
  // Some filesystems cannot fsync a directory (EINVAL); their renames are as durable as they get.
  if (::fsync(dir_fd_) != 0 && errno != EINVAL) {
    return FileError(errno, "fsync of the directory failed", Split(path_).first);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const SafeWriteOptions& options) {
  absl::StatusOr<AtomicFileWriter> file = AtomicFileWriter::Create(path, options);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(contents); !s.ok()) return s;
  return file->Commit();
}

absl::StatusOr<int> OpenRegularFile(const std::string& path, int flags, mode_t mode) {
  const bool writing = (flags & O_ACCMODE) != O_RDONLY;
  // O_NONBLOCK: a FIFO fails (ENXIO) or is refused below, never waits for its other end.
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, mode);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, " is missing"));
    struct stat st;
    // A link (ELOOP) or a FIFO (ENXIO): say what it is.
    if ((error == ELOOP || error == ENXIO) && ::lstat(path.c_str(), &st) == 0 &&
        !S_ISREG(st.st_mode)) {
      return NotRegular(path, st.st_mode, AT_FDCWD, path, writing);
    }
    return FileError(error, "cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return FileError(error, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotRegular(path, st.st_mode, AT_FDCWD, path, writing);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<int> OpenRegularFileForAppend(const std::string& path, mode_t mode) {
  if (absl::Status s = CheckRegularFileTarget(path); !s.ok()) return s;
  return OpenRegularFile(path, O_WRONLY | O_APPEND | O_CREAT, mode);
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "cannot open directory", dir);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) return FileError(error, "fsync of the directory failed", dir);
  return absl::OkStatus();
}

}  // namespace zerod
