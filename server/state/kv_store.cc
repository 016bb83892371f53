#include "server/state/kv_store.h"

#include <future>

namespace zerod::server {

KvOp KvOp::Put(std::string key, std::string value) {
  return {Kind::kPut, std::move(key), std::move(value), 0, std::nullopt};
}
KvOp KvOp::Delete(std::string key) { return {Kind::kDelete, std::move(key), "", 0, std::nullopt}; }
KvOp KvOp::DeletePrefix(std::string prefix) {
  return {Kind::kDeletePrefix, std::move(prefix), "", 0, std::nullopt};
}
KvOp KvOp::Add(std::string key, int64_t delta) {
  return {Kind::kAdd, std::move(key), "", delta, std::nullopt};
}
KvOp KvOp::CompareAndSwap(std::string key, std::optional<std::string> expected,
                          std::string desired) {
  return {Kind::kCompareAndSwap, std::move(key), std::move(desired), 0, std::move(expected)};
}

absl::StatusOr<CommitResult> KvStore::CommitSync(std::vector<KvOp> ops) {
  std::promise<absl::StatusOr<CommitResult>> promise;
  auto future = promise.get_future();
  Commit(std::move(ops),
         [&promise](absl::StatusOr<CommitResult> r) { promise.set_value(std::move(r)); });
  return future.get();
}

}  // namespace zerod::server
