#include "server/state/state_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/common/safe_file.h"
#include "server/logging.h"

namespace zerod::server {
namespace {

constexpr char kResetFlag[] = "--reset-state";

std::string Errno(int err) { return strerror(err); }

// A state file that exists must be the daemon user's own regular file, writable by nobody else:
// the data dir is checked too (ClaimDataDir), but a file planted while the dir was open to others
// would outlive a chmod of the dir. A link is refused rather than followed.
absl::Status CheckStateFile(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("cannot stat ", path, ": ", Errno(errno)));
  }
  std::string problem;
  if (S_ISLNK(st.st_mode)) {
    problem = "is a symbolic link";
  } else if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != geteuid()) {
    problem =
        absl::StrCat("belongs to uid ", st.st_uid, ", not to zerod's user (uid ", geteuid(), ")");
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    problem = absl::StrFormat("may be written by others (mode %04o)", st.st_mode & 0777);
  }
  if (problem.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "state file ", path, " ", problem,
      ": someone else may have planted it; zerod did not open it. Move it away (or chmod 600 a "
      "file that is yours) and start again"));
}

// The marker's id; nullopt when there is no marker.
absl::StatusOr<std::optional<std::string>> ReadMarker(const std::string& marker) {
  const int fd = open(marker.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    return absl::UnavailableError(absl::StrCat("cannot read ", marker, ": ", Errno(errno)));
  }
  char buffer[128];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  close(fd);
  if (n < 0)
    return absl::UnavailableError(absl::StrCat("cannot read ", marker, ": ", Errno(errno)));
  std::string id(buffer, static_cast<size_t>(n));
  absl::StripAsciiWhitespace(&id);
  if (id.empty() || id.size() > 64) {
    return absl::DataLossError(absl::StrCat("state marker ", marker, " is damaged (",
                                            id.empty() ? "empty" : "too long", ")"));
  }
  return id;
}

// Written under a fresh name beside it and renamed, both synced (safe_file.h): a crash leaves the
// old marker or the new, and nothing planted beside it (a link at a fixed temporary name) is
// written through.
absl::Status WriteMarker(const std::string& marker, const std::string& id) {
  SafeWriteOptions options;
  options.mode = 0600;
  absl::Status s = WriteFileAtomically(marker, id + "\n", options);
  if (s.ok() || absl::IsResourceExhausted(s) || absl::IsFailedPrecondition(s)) return s;
  return absl::UnavailableError(absl::StrCat("cannot write ", marker, ": ", s.message()));
}

// Renames every state file that exists to NAME.reset-<UTC time>; never deletes.
absl::Status MoveStateAside(const std::string& data_dir) {
  const std::string db = StateDatabasePath(data_dir);
  const std::string marker = StateMarkerPath(data_dir);
  std::string stamp = absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone());
  // Two resets within a second keep both backups.
  struct stat st {};
  for (int i = 2; stat((db + ".reset-" + stamp).c_str(), &st) == 0 ||
                  stat((marker + ".reset-" + stamp).c_str(), &st) == 0;
       ++i) {
    stamp =
        absl::StrCat(absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()), "-", i);
  }
  // The -wal and -shm keep their suffix, so that SQLite opens the backup with its log.
  const std::vector<std::pair<std::string, std::string>> moves = {
      {db, db + ".reset-" + stamp},
      {db + "-wal", db + ".reset-" + stamp + "-wal"},
      {db + "-shm", db + ".reset-" + stamp + "-shm"},
      {marker, marker + ".reset-" + stamp}};
  auto log = Logger("state");
  bool moved = false;
  for (const auto& [from, to] : moves) {
    if (stat(from.c_str(), &st) != 0) continue;
    if (rename(from.c_str(), to.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat(kResetFlag, ": cannot move ", from, " to ", to, ": ", Errno(errno)));
    }
    log->warn("{}: moved {} ({} bytes) to {}", kResetFlag, from, st.st_size, to);
    moved = true;
  }
  if (!moved) log->warn("{}: {} held no state files; starting empty", kResetFlag, data_dir);
  return absl::OkStatus();
}

// What the operator can do about a damaged state, appended to every such error.
absl::Status WithRecovery(const absl::Status& status, const std::string& data_dir) {
  if (status.code() != absl::StatusCode::kDataLoss) return status;
  return absl::DataLossError(absl::StrCat(
      status.message(),
      ". zerod did not start and deleted nothing. To start with an empty state, keeping the old "
      "files, run zerod once with ",
      kResetFlag, ": it moves ", StateDatabasePath(data_dir), " (and its -wal, -shm) and ",
      StateMarkerPath(data_dir), " to *.reset-<UTC time>"));
}

absl::StatusOr<std::unique_ptr<SqliteKvStore>> Open(const std::string& data_dir,
                                                    const StateDirOptions& options) {
  const std::string db = StateDatabasePath(data_dir);
  const std::string marker = StateMarkerPath(data_dir);
  for (const std::string& path : {db, db + "-wal", db + "-shm", marker}) {
    if (absl::Status s = CheckStateFile(path); !s.ok()) return s;
  }
  auto expected = ReadMarker(marker);
  if (!expected.ok()) return expected.status();
  if (expected->has_value()) {
    const std::string kept =
        absl::StrCat(", but ", marker, " says state ", **expected, " was kept there");
    struct stat st {};
    if (stat(db.c_str(), &st) != 0) {
      if (errno != ENOENT) {
        return absl::UnavailableError(absl::StrCat("cannot stat ", db, ": ", Errno(errno)));
      }
      return absl::DataLossError(absl::StrCat("state database ", db, " is missing", kept));
    }
    if (st.st_size == 0) {
      return absl::DataLossError(absl::StrCat("state database ", db, " is empty (0 bytes)", kept));
    }
  } else {
    // A data dir that never held state (or held it before markers): the file is made 0600, and
    // SQLite gives its -wal and -shm files the same mode.
    const int fd = open(db.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot open state database ", db, ": ", Errno(errno)));
    }
    close(fd);
  }
  // The state holds every job's rendezvous keys: readable by the daemon's user only.
  chmod(db.c_str(), 0600);
  auto store =
      SqliteKvStore::Open(db, SqliteOpenOptions{options.durability, expected->has_value()});
  if (!store.ok()) return store.status();
  if (expected->has_value()) {
    if ((*store)->state_id() != **expected) {
      return absl::DataLossError(absl::StrCat(
          "state database ", db, " holds state ", (*store)->state_id(), ", not the state ",
          **expected, " that ", marker, " says was kept there: it is another state's file"));
    }
    return store;
  }
  if (absl::Status s = WriteMarker(marker, (*store)->state_id()); !s.ok()) return s;
  Logger("state")->info("state {} is {}; marked in {}", db, (*store)->state_id(), marker);
  return store;
}

}  // namespace

std::string StateDatabasePath(const std::string& data_dir) { return data_dir + "/zerod.db"; }
std::string StateMarkerPath(const std::string& data_dir) { return data_dir + "/zerod.state-id"; }

absl::StatusOr<std::unique_ptr<SqliteKvStore>> OpenStateDir(const std::string& data_dir,
                                                            const StateDirOptions& options) {
  if (options.reset_state) {
    if (absl::Status s = MoveStateAside(data_dir); !s.ok()) return s;
  }
  auto store = Open(data_dir, options);
  if (!store.ok()) return WithRecovery(store.status(), data_dir);
  return store;
}

}  // namespace zerod::server
