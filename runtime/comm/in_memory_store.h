#ifndef ZEROD_RUNTIME_COMM_IN_MEMORY_STORE_H_
#define ZEROD_RUNTIME_COMM_IN_MEMORY_STORE_H_

// A Store in one process's memory (c10d's HashStore): for unit tests and single-process runs.

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"

namespace zerod::comm {

class InMemoryStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired) override;
  absl::StatusOr<bool> Delete(const std::string& key) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Parses the decimal text Add stores; an error names the key.
absl::StatusOr<int64_t> ParseStoredInt(const std::string& key, const std::string& text);

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_IN_MEMORY_STORE_H_
