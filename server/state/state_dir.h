#ifndef ZEROD_SERVER_STATE_STATE_DIR_H_
#define ZEROD_SERVER_STATE_STATE_DIR_H_

// The daemon's state in its data dir: zerod.db (SqliteKvStore) and zerod.state-id, a marker
// written beside it when the state is first made, holding the id stored inside the database.
//
// The marker is how the daemon knows that state existed: with it present, a zerod.db that is
// missing, empty, without zerod's tables, damaged or holding another id is an error naming the
// file, and nothing is changed. The one way past it is explicit: `reset_state` moves every state
// file aside under a dated name (never deleting it) and starts empty.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/state/sqlite_kv_store.h"

namespace zerod::server {

struct StateDirOptions {
  Durability durability = Durability::kFull;
  // Move zerod.db (with its -wal and -shm) and the marker to *.reset-<UTC time> first.
  bool reset_state = false;
};

std::string StateDatabasePath(const std::string& data_dir);  // DIR/zerod.db
std::string StateMarkerPath(const std::string& data_dir);    // DIR/zerod.state-id

// Opens (or, in a data dir that never held state, creates) the state. The files are 0600.
// Errors about the files' contents are DATA_LOSS and say how to recover.
absl::StatusOr<std::unique_ptr<SqliteKvStore>> OpenStateDir(const std::string& data_dir,
                                                            const StateDirOptions& options);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_STATE_DIR_H_
