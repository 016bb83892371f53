#ifndef ZEROD_SERVER_STORE_SERVICE_H_
#define ZEROD_SERVER_STORE_SERVICE_H_

// The Store gRPC service: translates calls into JobStore operations (job_store.h), which keep
// each job's keys under jobs/<job>/kv/. Waiting calls (blocking get, wait, barrier) hold no
// thread, and reactor methods never block. With JobTokens, every call needs the job's token or the
// admin's: only a job's members read or write its keys.

#include <memory>

#include "server/auth/job_tokens.h"
#include "server/clock.h"
#include "server/job_registry.h"
#include "server/job_store.h"
#include "server/state/kv_store.h"
#include "zerod/v1/store.grpc.pb.h"

namespace zerod::server {

class StoreService final : public v1::Store::CallbackService {
 public:
  // Jobs use their Store once they exist in `registry`. Owns a JobStore (and its timer thread).
  // `tokens`: null turns authentication off.
  StoreService(KvStore* kv, const Clock* clock, const JobRegistry* registry, StoreLimits limits,
               const auth::JobTokens* tokens);

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
  void Shutdown() { store_.Shutdown(); }

 private:
  // Finishes `reactor` with the refusal and returns false when the call may not use the job's
  // Store.
  bool Allowed(grpc::CallbackServerContext* context, const std::string& job_id,
               grpc::ServerUnaryReactor* reactor) const;

  const auth::JobTokens* const tokens_;
  JobStore store_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STORE_SERVICE_H_
