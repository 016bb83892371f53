#ifndef ZEROD_RUNTIME_COMM_GLOO_STORE_ADAPTER_H_
#define ZEROD_RUNTIME_COMM_GLOO_STORE_ADAPTER_H_

// Gloo's rendezvous store on top of our comm::Store, so Gloo's full-mesh connect exchanges
// addresses through the coordinator. Gloo expects exceptions; failures throw std::runtime_error
// with the Store's message.

#include <gloo/rendezvous/store.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/store.h"

namespace zerod::comm::internal {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::string(data.begin(), data.end())), key);
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->Get(key, timeout_);
    Check(value.status(), key);
    return {value->begin(), value->end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    Check(store_->Wait(keys, timeout_), keys.empty() ? "" : keys[0]);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    Check(store_->Wait(keys, absl::FromChrono(t)), keys.empty() ? "" : keys[0]);
  }

 private:
  static void Check(const absl::Status& s, const std::string& key) {
    if (!s.ok()) {
      throw std::runtime_error("gloo rendezvous key '" + key + "': " + std::string(s.message()));
    }
  }

  std::shared_ptr<comm::Store> store_;
  absl::Duration timeout_;
};

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_STORE_ADAPTER_H_
