#include "runtime/comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/comm/in_memory_store.h"

namespace zerod::comm {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("file store: ", what, " ", path, ": ", strerror(errno)));
}

// Holds the directory's lock file exclusively while it lives.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& directory)
      : path_(directory + "/.lock"), fd_(open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ >= 0 && flock(fd_, LOCK_EX) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~DirectoryLock() {
    if (fd_ >= 0) close(fd_);  // releases the flock
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  absl::Status status() const {
    return fd_ >= 0 ? absl::OkStatus() : ErrnoError("cannot lock", path_);
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {}

std::string FileStore::PathOf(const std::string& key) const {
  return absl::StrCat(directory_, "/", absl::BytesToHexString(key));
}

absl::StatusOr<std::optional<std::string>> FileStore::Read(const std::string& key) const {
  const std::string path = PathOf(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::optional<std::string>();
    return ErrnoError("cannot read", path);
  }
  std::ostringstream value;
  value << in.rdbuf();
  return std::optional<std::string>(value.str());
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  const std::string path = PathOf(key);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", gettid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out.flush()) return ErrnoError("cannot write", tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename", tmp);
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::optional<std::string>> value = Read(key);
    if (!value.ok()) return value.status();
    if (value->has_value()) return **value;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "file store: key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  DirectoryLock lock(directory_);
  if (!lock.status().ok()) return lock.status();
  absl::StatusOr<std::optional<std::string>> current = Read(key);
  if (!current.ok()) return current.status();
  int64_t value = 0;
  if (current->has_value()) {
    absl::StatusOr<int64_t> parsed = ParseStoredInt(key, **current);
    if (!parsed.ok()) return parsed.status();
    value = *parsed;
  }
  value += delta;
  absl::Status written = Set(key, absl::StrCat(value));
  if (!written.ok()) return written;
  return value;
}

absl::StatusOr<std::string> FileStore::CompareSet(const std::string& key,
                                                  const std::optional<std::string>& expected,
                                                  const std::string& desired) {
  DirectoryLock lock(directory_);
  if (!lock.status().ok()) return lock.status();
  absl::StatusOr<std::optional<std::string>> current = Read(key);
  if (!current.ok()) return current.status();
  if (*current != expected) return current->value_or("");
  absl::Status written = Set(key, desired);
  if (!written.ok()) return written;
  return desired;
}

absl::StatusOr<bool> FileStore::Delete(const std::string& key) {
  const std::string path = PathOf(key);
  if (unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoError("cannot remove", path);
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (access(PathOf(key).c_str(), F_OK) != 0) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("file store: keys ", absl::StrJoin(missing, ", "), " did not appear within ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace zerod::comm
