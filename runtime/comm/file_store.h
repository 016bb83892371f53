#ifndef ZEROD_RUNTIME_COMM_FILE_STORE_H_
#define ZEROD_RUNTIME_COMM_FILE_STORE_H_

// A Store in a directory shared by processes on one machine (c10d's FileStore): for benchmarks
// and tests whose ranks are separate processes but need no coordinator. Each key is a file
// (its name the key in hex); a write is a rename, so a reader sees a whole value or none;
// read-modify-writes (Add, CompareSet) hold an flock on the directory's lock file. Waits poll
// every millisecond. Not for production rendezvous (that is the coordinator's store): Set does not
// take the lock (a Set racing a CompareSet of the same key may be lost), and a key's file name is
// its hex, so keys over about 127 bytes exceed NAME_MAX.

#include <string>

#include "runtime/comm/store.h"

namespace zerod::comm {

class FileStore final : public Store {
 public:
  // `directory` must exist and be writable.
  explicit FileStore(std::string directory);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired) override;
  absl::StatusOr<bool> Delete(const std::string& key) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  std::string PathOf(const std::string& key) const;
  // The value at `key`, nullopt when it does not exist.
  absl::StatusOr<std::optional<std::string>> Read(const std::string& key) const;

  const std::string directory_;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_FILE_STORE_H_
