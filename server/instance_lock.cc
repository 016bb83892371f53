#include "server/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace zerod::server {
namespace {

std::string ReadAll(int fd) {
  std::string text;
  char buffer[64];
  ssize_t n;
  lseek(fd, 0, SEEK_SET);
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

absl::Status CheckDataDirIsPrivate(const std::string& dir) {
  // The directory itself, through a link if the operator made one: what matters is who can add,
  // replace or remove the files in it (zerod.db, zerod.state-id, admin.token).
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open data dir ", dir, ": ", std::strerror(error)));
  }
  close(fd);
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "data dir %s belongs to uid %d, not to zerod's user (uid %d): whoever owns it can replace "
        "the state and the admin token; give zerod a directory of its own (a missing one is made "
        "0700) or chown it",
        dir, static_cast<int>(st.st_uid), static_cast<int>(geteuid())));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "data dir %s may be written by others (mode %04o): anyone who can write it can plant the "
        "state or the admin token; chmod 0700 it, or give zerod a directory of its own (a missing "
        "one is made 0700)",
        dir, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

// Whether a program accepts connections on the Unix socket at `path`. Only a refused connection
// proves the socket stale (its listener is gone); any other outcome, a listener with a full
// backlog included, leaves the socket alone.
absl::Status CheckSocketIsStale(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) return absl::OkStatus();  // the bind will say
  path.copy(address.sun_path, path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot check socket ", path, ": ", std::strerror(errno)));
  }
  const int answered = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int error = errno;
  close(fd);
  if (answered != 0 && (error == ECONNREFUSED || error == ENOENT)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "socket ", path, " is in use by a program that is not a zerod holding ", path, ".lock (",
      answered == 0 ? "it accepted a connection" : std::strerror(error),
      "); zerod does not take over a live socket: stop that program, or give --socket another "
      "path"));
}

}  // namespace

absl::StatusOr<InstanceLock> InstanceLock::Acquire(const std::string& path,
                                                   const std::string& what) {
  // O_NOFOLLOW: the file is truncated below, so a link planted in its place must not make the
  // daemon truncate whatever it points to.
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lock file ", path, " is a symbolic link; zerod does not follow it: remove it"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open lock file ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    const bool regular = S_ISREG(st.st_mode);
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("lock file %s is %s, not a file of zerod's user (uid %d); remove it", path,
                        regular ? absl::StrCat("owned by uid ", st.st_uid) : "not a regular file",
                        static_cast<int>(geteuid())));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    std::string holder = std::string(absl::StripAsciiWhitespace(ReadAll(fd)));
    close(fd);
    if (error == EWOULDBLOCK) {
      int pid = 0;
      return absl::FailedPreconditionError(absl::StrCat(
          what, " is in use by another zerod",
          absl::SimpleAtoi(holder, &pid) ? absl::StrCat(" (pid ", pid, ")") : std::string(),
          "; stop it first, or give this one another --data-dir and --socket"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot lock ", path, ": ", std::strerror(error)));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The claim holds without the pid; only the message of a refused daemon loses it.
  }
  return InstanceLock(fd);
}

InstanceLock::InstanceLock(InstanceLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

InstanceLock& InstanceLock::operator=(InstanceLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

InstanceLock::~InstanceLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
}

absl::StatusOr<InstanceLock> ClaimDataDir(const std::string& dir) {
  std::error_code ec;
  const bool created = std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data dir ", dir, ": ", ec.message()));
  }
  // A folder made here is private; an existing one keeps its mode, if no one else can write it.
  if (created) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make data dir ", dir, " private (0700): ", ec.message()));
    }
  }
  if (absl::Status s = CheckDataDirIsPrivate(dir); !s.ok()) return s;
  return InstanceLock::Acquire(dir + "/zerod.lock", absl::StrCat("data dir ", dir));
}

absl::StatusOr<InstanceLock> ClaimSocketPath(const std::string& path) {
  const std::filesystem::path socket(path);
  std::error_code ec;
  if (socket.has_parent_path()) std::filesystem::create_directories(socket.parent_path(), ec);
  auto lock = InstanceLock::Acquire(path + ".lock", absl::StrCat("socket ", path));
  if (!lock.ok()) return lock.status();
  // Holding the claim, a socket file here was left by a daemon that died, unless something still
  // answers on it: only a stale socket is removed, so the bind can take the path.
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    if (absl::Status s = CheckSocketIsStale(path); !s.ok()) return s;
    std::filesystem::remove(socket, ec);
  }
  return lock;
}

}  // namespace zerod::server
