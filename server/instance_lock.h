#ifndef ZEROD_SERVER_INSTANCE_LOCK_H_
#define ZEROD_SERVER_INSTANCE_LOCK_H_

// One zerod per data directory and per Unix socket path. Two daemons on one SQLite file both
// acknowledged writes and lost one; a second daemon given a live daemon's socket path unlinked it
// and answered in its place with another state. Each claim is an flock(2) on a lock file, which
// the kernel releases when the process dies, even by kill -9, so a crashed daemon never leaves a
// stale claim behind; the lock file records the holder's pid for the error message. A lock file is
// opened without following links and must be a regular file of the daemon's user: it is truncated,
// and a link planted in its place would otherwise truncate a file of the planter's choosing.

#include <string>

#include "absl/status/statusor.h"

namespace zerod::server {

class InstanceLock {
 public:
  // Claims `path` (created 0600 if missing). FAILED_PRECONDITION when another live process holds
  // it: "<what> is in use by another zerod (pid P)", or when `path` is a symbolic link or not a
  // regular file of the daemon's user.
  static absl::StatusOr<InstanceLock> Acquire(const std::string& path, const std::string& what);

  InstanceLock(InstanceLock&& other) noexcept;
  InstanceLock& operator=(InstanceLock&& other) noexcept;
  InstanceLock(const InstanceLock&) = delete;
  InstanceLock& operator=(const InstanceLock&) = delete;
  ~InstanceLock();  // releases the claim

 private:
  explicit InstanceLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Makes the data directory if missing (0700: its files hold the jobs' rendezvous keys) and claims
// it (`<dir>/zerod.lock`). An existing one must belong to the daemon's user and be writable by no
// one else (FAILED_PRECONDITION naming the dir and the fix): whoever can write it could plant the
// state or the admin token, as `nobody` could in a 1777 directory.
absl::StatusOr<InstanceLock> ClaimDataDir(const std::string& dir);

// Claims a Unix socket path (`<path>.lock`), then removes a socket file a dead daemon left there,
// so the bind can take the path. Nothing but a socket is ever removed, and only one that refuses a
// connection: a socket some other program still answers on is FAILED_PRECONDITION, untouched.
absl::StatusOr<InstanceLock> ClaimSocketPath(const std::string& path);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_INSTANCE_LOCK_H_
