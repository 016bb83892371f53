#include "runtime/common/safe_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
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
    return absl::FailedPreconditionError(absl::StrCat(path, " is a symbolic link (to ",
                                                      LinkTargetAt(dir_fd, name), "): refusing to ",
                                                      writing ? "write" : "read", " through it"));
  }
  return absl::FailedPreconditionError(absl::StrCat(path, " is ", KindOf(mode),
                                                    ", not a regular file: refusing to ",
                                                    writing ? "write to" : "read", " it"));
}

// `name` in `dir_fd`: OK when absent or a regular file (its mode then in `*mode`, else 0).
absl::Status CheckAt(int dir_fd, const std::string& name, const std::string& path,
                     mode_t* mode = nullptr) {
  if (mode != nullptr) *mode = 0;
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return FileError(errno, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode, dir_fd, name);
  if (mode != nullptr) *mode = st.st_mode & 07777;
  return absl::OkStatus();
}

// INVALID_ARGUMENT for a path that names no file: empty, or ending in '/' (a directory).
absl::Status CheckNamesAFile(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("no file named (an empty path)");
  if (path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " ends with '/': it names a directory, not a file"));
  }
  return absl::OkStatus();
}

// `path` split into its directory ("." when none) and its last component.
std::pair<std::string, std::string> Split(const std::string& path) {
  const std::string trimmed = WithoutTrailingSlashes(path);
  const size_t slash = trimmed.rfind('/');
  if (slash == std::string::npos) return {".", trimmed};
  return {slash == 0 ? "/" : trimmed.substr(0, slash), trimmed.substr(slash + 1)};
}

// `bytes` from the kernel's generator: getrandom, else /dev/urandom (an old kernel, a sandbox
// that filters the call). False when neither gives them.
bool FillRandom(unsigned char* bytes, size_t size) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::getrandom(bytes + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == size) return true;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return false;
  got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, bytes + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return got == size;
}

// Six random characters from [A-Za-z0-9]: the part of a temporary name nobody can guess. With no
// generator at all, the process id, a counter and the clock, mixed (splitmix64): still a name no
// other writer in this process or another one uses, and O_EXCL refuses any name taken.
std::string RandomSuffix() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[6];
  if (!FillRandom(bytes, sizeof(bytes))) {
    static std::atomic<uint64_t> counter{0};
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    uint64_t x = (static_cast<uint64_t>(::getpid()) << 40) ^ (counter.fetch_add(1) << 20) ^
                 static_cast<uint64_t>(now.tv_nsec) ^ (static_cast<uint64_t>(now.tv_sec) << 30);
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    for (unsigned char& b : bytes) {
      b = static_cast<unsigned char>(x);
      x >>= 8;
    }
  }
  std::string out;
  for (unsigned char b : bytes) out += kAlphabet[b % (sizeof(kAlphabet) - 1)];
  return out;
}

}  // namespace

std::string LinkTargetAt(int dir_fd, const std::string& name) {
  char target[4096];
  const ssize_t n = ::readlinkat(dir_fd, name.c_str(), target, sizeof(target));
  if (n <= 0) return "?";
  return std::string(target, static_cast<size_t>(n));
}

std::string LinkTarget(const std::string& path) { return LinkTargetAt(AT_FDCWD, path); }

std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

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
  if (absl::Status s = CheckNamesAFile(path); !s.ok()) return s;
  return CheckAt(AT_FDCWD, path, path);
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path,
                                                          const SafeWriteOptions& options) {
  if (absl::Status s = CheckNamesAFile(path); !s.ok()) return s;
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
  mode_t old_mode = 0;
  if (absl::Status s = CheckAt(dir_fd, name, path, &old_mode); !s.ok()) {
    ::close(dir_fd);
    return s;
  }
  // O_EXCL with a fresh name: never a file (or link) someone put there first.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string temp = absl::StrCat(name, ".", RandomSuffix(), ".tmp");
    const int fd = ::openat(dir_fd, temp.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, options.mode);
    if (fd >= 0) {
      // The file it replaces keeps its mode (a 0600 file does not become readable by others).
      if (old_mode != 0 && ::fchmod(fd, old_mode) != 0) {
        const int error = errno;
        ::close(fd);
        ::unlinkat(dir_fd, temp.c_str(), 0);
        ::close(dir_fd);
        return FileError(error, "cannot give the new file the old one's mode", path);
      }
      return AtomicFileWriter(path, dir_fd, std::move(temp), fd);
    }
    if (errno != EEXIST) {
      const int error = errno;
      ::close(dir_fd);
      return FileError(error, absl::StrCat("cannot create a file in ", dir, " to write it"), path);
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
