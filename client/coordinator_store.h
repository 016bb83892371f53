#ifndef ZEROD_CLIENT_COORDINATOR_STORE_H_
#define ZEROD_CLIENT_COORDINATOR_STORE_H_

// The runtime's rendezvous Store (runtime/comm/store.h) on the zerod daemon: keys live in the
// job's durable key space, blocking reads wait server-side.

#include <memory>
#include <string>

#include "client/coordinator_client.h"
#include "runtime/comm/store.h"

namespace zerod::client {

class CoordinatorStore final : public comm::Store {
 public:
  CoordinatorStore(std::shared_ptr<CoordinatorClient> client, std::string job_id)
      : client_(std::move(client)), job_id_(std::move(job_id)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return client_->StoreSet(job_id_, key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return client_->StoreGet(job_id_, key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return client_->StoreAdd(job_id_, key, delta);
  }
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired) override {
    auto r = client_->StoreCompareSet(job_id_, key, expected, desired);
    if (!r.ok()) return r.status();
    return r->value();
  }
  absl::StatusOr<bool> Delete(const std::string& key) override {
    return client_->StoreDelete(job_id_, key);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return client_->StoreWait(job_id_, keys, timeout);
  }

 private:
  std::shared_ptr<CoordinatorClient> client_;
  const std::string job_id_;
};

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_COORDINATOR_STORE_H_
