#ifndef ZEROD_RUNTIME_COMM_PREFIX_STORE_H_
#define ZEROD_RUNTIME_COMM_PREFIX_STORE_H_

// Puts every key of a Store under "prefix/" (c10d's PrefixStore), so that independent users of
// one store (a communicator per generation, a barrier per step) cannot collide.

#include <memory>
#include <string>

#include "runtime/comm/store.h"

namespace zerod::comm {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix) + "/"), inner_(std::move(inner)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_->Set(prefix_ + key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return inner_->Get(prefix_ + key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_->Add(prefix_ + key, delta);
  }
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired) override {
    return inner_->CompareSet(prefix_ + key, expected, desired);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override {
    return inner_->Delete(prefix_ + key);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const std::string& k : keys) prefixed.push_back(prefix_ + k);
    return inner_->Wait(prefixed, timeout);
  }

 private:
  const std::string prefix_;
  const std::shared_ptr<Store> inner_;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_PREFIX_STORE_H_
