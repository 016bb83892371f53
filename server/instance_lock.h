#ifndef ZEROD_SERVER_INSTANCE_LOCK_H_
#define ZEROD_SERVER_INSTANCE_LOCK_H_

// One zerod per data directory and per Unix socket path. Two daemons on one SQLite file both
// acknowledged writes and lost one; a second daemon given a live daemon's socket path unlinked it
// and answered in its place with another state. Each claim is an flock(2) on a lock file, which
// the kernel releases when the process dies, even by kill -9, so a crashed daemon never leaves a
// stale claim behind; the lock file records the holder's pid for the error message.

#include <string>

#include "absl/status/statusor.h"

namespace zerod::server {

class InstanceLock {
 public:
  // Claims `path` (created 0600 if missing). FAILED_PRECONDITION when another live process holds
  // it: "<what> is in use by another zerod (pid P)".
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

// Makes the data directory if missing (0700: its files hold the jobs' rendezvous keys; an existing
// one keeps its mode) and claims it (`<dir>/zerod.lock`).
absl::StatusOr<InstanceLock> ClaimDataDir(const std::string& dir);

// Claims a Unix socket path (`<path>.lock`), then removes a socket file a dead daemon left there,
// so the bind can take the path. Nothing but a socket is ever removed.
absl::StatusOr<InstanceLock> ClaimSocketPath(const std::string& path);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_INSTANCE_LOCK_H_
