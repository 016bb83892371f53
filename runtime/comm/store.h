#ifndef ZEROD_RUNTIME_COMM_STORE_H_
#define ZEROD_RUNTIME_COMM_STORE_H_

// Store: the rendezvous key-value store ranks use to exchange small values (NCCL unique ids, Gloo
// addresses, barriers), shaped like PyTorch c10d's Store. In real runs client/'s
// CoordinatorStore puts it on the zerod daemon; InMemoryStore serves unit tests; PrefixStore
// namespaces keys. Implementations are thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zerod::comm {

class Store {
 public:
  virtual ~Store() = default;

  [[nodiscard]] virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, up to `timeout`: DEADLINE_EXCEEDED naming the key after that.
  [[nodiscard]] virtual absl::StatusOr<std::string> Get(const std::string& key,
                                                        absl::Duration timeout) = 0;
  // Adds `delta` to the integer at `key` (a missing key counts as 0); returns the new value.
  // The integer is stored as decimal text.
  [[nodiscard]] virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Sets `key` to `desired` if it holds `expected` (nullopt: if it is missing). Returns the value
  // stored afterwards, which equals `desired` exactly when the swap happened.
  [[nodiscard]] virtual absl::StatusOr<std::string> CompareSet(
      const std::string& key, const std::optional<std::string>& expected,
      const std::string& desired) = 0;
  // True when the key existed.
  [[nodiscard]] virtual absl::StatusOr<bool> Delete(const std::string& key) = 0;
  // Waits until every key exists, up to `timeout`.
  [[nodiscard]] virtual absl::Status Wait(const std::vector<std::string>& keys,
                                          absl::Duration timeout) = 0;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_STORE_H_
