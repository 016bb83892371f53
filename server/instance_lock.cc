#include "server/instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<InstanceLock> InstanceLock::Acquire(const std::string& path,
                                                   const std::string& what) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open lock file ", path, ": ", std::strerror(errno)));
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
  // Only a folder made here: an existing one (say --data-dir /tmp) keeps its mode; the state
  // files in it are 0600 either way.
  if (created) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make data dir ", dir, " private (0700): ", ec.message()));
    }
  }
  return InstanceLock::Acquire(dir + "/zerod.lock", absl::StrCat("data dir ", dir));
}

absl::StatusOr<InstanceLock> ClaimSocketPath(const std::string& path) {
  const std::filesystem::path socket(path);
  std::error_code ec;
  if (socket.has_parent_path()) std::filesystem::create_directories(socket.parent_path(), ec);
  auto lock = InstanceLock::Acquire(path + ".lock", absl::StrCat("socket ", path));
  if (!lock.ok()) return lock.status();
  // Holding the claim, a socket file here was left by a daemon that died: remove it so the bind
  // can take the path.
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) std::filesystem::remove(socket, ec);
  return lock;
}

}  // namespace zerod::server
