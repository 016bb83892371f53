#ifndef ZEROD_SERVER_STORE_SERVICE_H_
#define ZEROD_SERVER_STORE_SERVICE_H_

// The Store gRPC service: per-job keys in the KvStore under jobs/<job>/kv/. Blocking reads,
// waits and barriers register a waiter that a KvStore watch (or a timer) completes: no thread is
// held while a rank waits.

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/job_registry.h"
#include "server/state/kv_store.h"
#include "server/timer_queue.h"
#include "zerod/v1/store.grpc.pb.h"

namespace zerod::server {

struct StoreLimits {
  int64_t max_key_bytes = 1024;
  int64_t max_value_bytes = 4 << 20;
  absl::Duration longest_wait = absl::Hours(1);
};

class StoreService final : public v1::Store::CallbackService {
 public:
  StoreService(KvStore* kv, const JobRegistry* registry, StoreLimits limits);
  ~StoreService() override;

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context, const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const v1::CompareSetRequest* request,
                                       v1::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse* response) override;

  // Completes every waiting call with UNAVAILABLE (daemon shutdown).
  void Shutdown();

  struct Waiter;

 private:
  absl::Status CheckJobAndKey(const std::string& job_id, const std::string& key) const;
  // Registers `waiter` for `keys` (full KvStore keys), then completes it if they already exist.
  void AwaitKeys(const std::shared_ptr<Waiter>& waiter, std::vector<std::string> keys,
                 absl::Time deadline);
  void TimedOut(const std::shared_ptr<Waiter>& waiter);
  void OnCommitted(const std::vector<KvEvent>& events);

  KvStore* const kv_;
  const JobRegistry* const registry_;
  const StoreLimits limits_;
  int64_t watch_id_ = 0;

  absl::Mutex mu_;
  // Waiters by the full key they still miss.
  std::multimap<std::string, std::shared_ptr<Waiter>> by_key_ ABSL_GUARDED_BY(mu_);
  // Barrier waiters by barrier prefix, with the participants seen so far.
  struct BarrierState {
    std::set<std::string> arrived;
    std::vector<std::pair<int64_t, std::shared_ptr<Waiter>>> waiters;  // (count, waiter)
  };
  absl::flat_hash_map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);

  // Last: destroyed first, so no timer runs against a half-destroyed service.
  TimerQueue timers_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STORE_SERVICE_H_
