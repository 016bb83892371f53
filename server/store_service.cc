#include "server/store_service.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/auth/call_auth.h"
#include "server/coordinator_service.h"

namespace zerod::server {
namespace {

using rpc::ToGrpc;

// A waiting call's limit: its own timeout, and the RPC's deadline less the margin that lets our
// answer, not the client's timer, report it.
WaitLimit LimitOf(const grpc::CallbackServerContext* context, int64_t timeout_ms) {
  return {absl::Milliseconds(timeout_ms), WaitDeadline(context, absl::InfiniteDuration())};
}

// Finishes `reactor` with `status`, after `fill` writes the response when it is OK.
template <class T, class Fill>
JobStore::Done<T> Answer(grpc::ServerUnaryReactor* reactor, Fill fill) {
  return [reactor, fill](absl::StatusOr<T> result) {
    if (result.ok()) fill(*result);
    reactor->Finish(ToGrpc(result.status()));
  };
}

std::function<void(absl::Status)> Answer(grpc::ServerUnaryReactor* reactor) {
  return [reactor](absl::Status status) { reactor->Finish(ToGrpc(status)); };
}

}  // namespace

StoreService::StoreService(KvStore* kv, const Clock* clock, const JobRegistry* registry,
                           StoreLimits limits, const auth::JobTokens* tokens)
    : tokens_(tokens),
      store_(
          kv, clock,
          [registry](const std::string& job_id) {
            if (registry->JobExists(job_id)) return absl::OkStatus();
            absl::Status missing = registry->Missing(job_id);  // quarantined, or not found
            if (missing.code() != absl::StatusCode::kNotFound) return missing;
            return absl::NotFoundError(absl::StrCat(missing.message(), " (join it first)"));
          },
          limits) {}

bool StoreService::Allowed(grpc::CallbackServerContext* context, const std::string& job_id,
                           grpc::ServerUnaryReactor* reactor) const {
  const absl::Status s = auth::Authorize(tokens_, *context, job_id, "use its Store");
  if (!s.ok()) reactor->Finish(ToGrpc(s));
  return s.ok();
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const v1::SetRequest* request,
                                            v1::SetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  store_.Set(
      request->job_id(), request->key(), request->value(),
      Answer<int64_t>(reactor, [response](int64_t revision) { response->set_revision(revision); }));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  store_.Get(request->job_id(), request->key(), LimitOf(context, request->timeout_ms()),
             Answer<KeyValue>(reactor, [response](const KeyValue& kv) {
               response->set_value(kv.value);
               response->set_revision(kv.mod_revision);
             }));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  store_.Add(request->job_id(), request->key(), request->delta(),
             Answer<int64_t>(reactor, [response](int64_t value) { response->set_value(value); }));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  std::optional<std::string> expected;
  if (!request->expected_absent()) expected = request->expected();
  store_.CompareSet(request->job_id(), request->key(), std::move(expected), request->desired(),
                    Answer<CompareSetResult>(reactor, [response](const CompareSetResult& r) {
                      response->set_swapped(r.swapped);
                      response->set_value(r.value);
                    }));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* context,
                                               const v1::DeleteRequest* request,
                                               v1::DeleteResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  store_.Delete(request->job_id(), request->key(), Answer<bool>(reactor, [response](bool deleted) {
                  response->set_deleted(deleted);
                }));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const v1::WaitRequest* request,
                                             v1::WaitResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  store_.Wait(request->job_id(), {request->keys().begin(), request->keys().end()},
              LimitOf(context, request->timeout_ms()), Answer(reactor));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Barrier(grpc::CallbackServerContext* context,
                                                const v1::BarrierRequest* request,
                                                v1::BarrierResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Allowed(context, request->job_id(), reactor)) return reactor;
  store_.Barrier(request->job_id(), request->name(), request->participant(), request->count(),
                 LimitOf(context, request->timeout_ms()), Answer(reactor));
  return reactor;
}

}  // namespace zerod::server
