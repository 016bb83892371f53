#include "server/store_service.h"

#include <algorithm>
#include <atomic>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/grpc_status.h"
#include "server/coordinator_service.h"
#include "server/job_records.h"

namespace zerod::server {

using rpc::ToGrpc;

// One waiting call. Whoever flips `done` first (a commit, the timer, shutdown) completes it.
struct StoreService::Waiter {
  std::atomic<bool> done{false};
  absl::Mutex mu;
  std::set<std::string> missing ABSL_GUARDED_BY(mu);
  std::function<void(absl::Status)> finish;

  void Complete(absl::Status status) {
    if (done.exchange(true)) return;
    finish(std::move(status));
  }
};

namespace {

constexpr char kBarrierKeyPrefix[] = "__barrier/";

// The server-side deadline of a waiting call: its own timeout, capped by the RPC's deadline.
absl::Time CallDeadline(const grpc::CallbackServerContext* context, int64_t timeout_ms,
                        absl::Duration longest) {
  return std::min(absl::Now() + absl::Milliseconds(std::max<int64_t>(timeout_ms, 0)),
                  WaitDeadline(context, longest));
}

std::string FullKey(const std::string& job_id, const std::string& key) {
  return StoreKeyPrefix(job_id) + key;
}

}  // namespace

StoreService::StoreService(KvStore* kv, const JobRegistry* registry, StoreLimits limits)
    : kv_(kv), registry_(registry), limits_(limits) {
  watch_id_ =
      kv_->Watch("jobs/", [this](const std::vector<KvEvent>& events) { OnCommitted(events); });
}

StoreService::~StoreService() { kv_->Unwatch(watch_id_); }

absl::Status StoreService::CheckJobAndKey(const std::string& job_id, const std::string& key) const {
  if (!registry_->JobExists(job_id)) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found (join it first)"));
  }
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": empty key"));
  if (static_cast<int64_t>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": key '", key.substr(0, 32),
                                                   "...' is ", key.size(), " bytes, over ",
                                                   limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

void StoreService::AwaitKeys(const std::shared_ptr<Waiter>& waiter, std::vector<std::string> keys,
                             absl::Time deadline) {
  {
    // Checking and registering under mu_ loses no wake-up: a commit publishes its data before
    // OnCommitted, which takes mu_, looks for waiters.
    absl::MutexLock lock(&mu_);
    absl::MutexLock waiter_lock(&waiter->mu);
    for (const std::string& k : keys) {
      if (kv_->Get(k).has_value() || !waiter->missing.insert(k).second) continue;
      by_key_.emplace(k, waiter);
    }
    if (!waiter->missing.empty()) {
      timers_.Schedule(deadline, [this, waiter] { TimedOut(waiter); });
      return;
    }
  }
  waiter->Complete(absl::OkStatus());
}

void StoreService::TimedOut(const std::shared_ptr<Waiter>& waiter) {
  std::string missing;
  {
    absl::MutexLock lock(&mu_);
    absl::MutexLock waiter_lock(&waiter->mu);
    for (const std::string& k : waiter->missing) {
      auto [begin, end] = by_key_.equal_range(k);
      for (auto it = begin; it != end;) {
        it = it->second == waiter ? by_key_.erase(it) : std::next(it);
      }
    }
    missing = absl::StrJoin(waiter->missing, ", ");
  }
  waiter->Complete(absl::DeadlineExceededError(absl::StrCat("keys not set in time: ", missing)));
}

void StoreService::OnCommitted(const std::vector<KvEvent>& events) {
  std::vector<std::shared_ptr<Waiter>> ready;
  absl::MutexLock lock(&mu_);
  for (const KvEvent& e : events) {
    if (!e.value.has_value()) continue;
    auto [begin, end] = by_key_.equal_range(e.key);
    for (auto it = begin; it != end;) {
      std::shared_ptr<Waiter> w = it->second;
      it = by_key_.erase(it);
      absl::MutexLock waiter_lock(&w->mu);
      w->missing.erase(e.key);
      if (w->missing.empty()) ready.push_back(w);
    }
    // Barrier arrivals: jobs/<job>/kv/__barrier/<name>/<participant>.
    const size_t at = e.key.find(std::string("/kv/") + kBarrierKeyPrefix);
    if (at == std::string::npos) continue;
    const size_t slash = e.key.rfind('/');
    auto barrier = barriers_.find(e.key.substr(0, slash + 1));
    if (barrier == barriers_.end()) continue;
    barrier->second.arrived.insert(e.key.substr(slash + 1));
    auto& waiters = barrier->second.waiters;
    const int64_t arrived = static_cast<int64_t>(barrier->second.arrived.size());
    for (auto w = waiters.begin(); w != waiters.end();) {
      if (arrived >= w->first) {
        ready.push_back(w->second);
        w = waiters.erase(w);
      } else {
        ++w;
      }
    }
    if (waiters.empty()) barriers_.erase(barrier);
  }
  for (const auto& w : ready) w->Complete(absl::OkStatus());
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const v1::SetRequest* request,
                                            v1::SetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckJobAndKey(request->job_id(), request->key()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  if (static_cast<int64_t>(request->value().size()) > limits_.max_value_bytes) {
    reactor->Finish(ToGrpc(absl::ResourceExhaustedError(absl::StrCat(
        "job ", request->job_id(), ": value for key '", request->key(), "' is ",
        request->value().size(), " bytes, over the limit of ", limits_.max_value_bytes))));
    return reactor;
  }
  kv_->Commit({KvOp::Put(FullKey(request->job_id(), request->key()), request->value())},
              [reactor, response](absl::StatusOr<CommitResult> r) {
                if (r.ok()) response->set_revision(r->revision);
                reactor->Finish(ToGrpc(r.status()));
              });
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckJobAndKey(request->job_id(), request->key()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  const std::string key = FullKey(request->job_id(), request->key());
  if (auto kv = kv_->Get(key); kv.has_value() || request->timeout_ms() <= 0) {
    if (!kv.has_value()) {
      reactor->Finish(ToGrpc(absl::NotFoundError(
          absl::StrCat("job ", request->job_id(), ": key '", request->key(), "' is not set"))));
    } else {
      response->set_value(kv->value);
      response->set_revision(kv->mod_revision);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }
  auto waiter = std::make_shared<Waiter>();
  waiter->finish = [this, reactor, response, key, job = request->job_id(),
                    user_key = request->key(), timeout = request->timeout_ms()](absl::Status s) {
    if (s.ok()) {
      if (auto kv = kv_->Get(key)) {
        response->set_value(kv->value);
        response->set_revision(kv->mod_revision);
      } else {
        s = absl::NotFoundError(
            absl::StrCat("job ", job, ": key '", user_key, "' was deleted right after it was set"));
      }
    } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      s = absl::DeadlineExceededError(
          absl::StrCat("job ", job, ": key '", user_key, "' was not set within ", timeout, " ms"));
    }
    reactor->Finish(ToGrpc(s));
  };
  const absl::Time deadline = CallDeadline(context, request->timeout_ms(), limits_.longest_wait);
  AwaitKeys(waiter, {key}, deadline);
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckJobAndKey(request->job_id(), request->key()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  kv_->Commit({KvOp::Add(FullKey(request->job_id(), request->key()), request->delta())},
              [reactor, response, job = request->job_id()](absl::StatusOr<CommitResult> r) {
                if (!r.ok()) {
                  reactor->Finish(ToGrpc(absl::Status(
                      r.status().code(), absl::StrCat("job ", job, ": ", r.status().message()))));
                  return;
                }
                int64_t value = 0;
                (void)absl::SimpleAtoi(*r->results[0].value, &value);
                response->set_value(value);
                reactor->Finish(grpc::Status::OK);
              });
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckJobAndKey(request->job_id(), request->key()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  std::optional<std::string> expected;
  if (!request->expected_absent()) expected = request->expected();
  kv_->Commit({KvOp::CompareAndSwap(FullKey(request->job_id(), request->key()), expected,
                                    request->desired())},
              [reactor, response](absl::StatusOr<CommitResult> r) {
                if (r.ok()) {
                  response->set_swapped(r->results[0].applied);
                  response->set_value(r->results[0].value.value_or(""));
                }
                reactor->Finish(ToGrpc(r.status()));
              });
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* context,
                                               const v1::DeleteRequest* request,
                                               v1::DeleteResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status s = CheckJobAndKey(request->job_id(), request->key()); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  kv_->Commit({KvOp::Delete(FullKey(request->job_id(), request->key()))},
              [reactor, response](absl::StatusOr<CommitResult> r) {
                if (r.ok()) response->set_deleted(r->results[0].applied);
                reactor->Finish(ToGrpc(r.status()));
              });
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const v1::WaitRequest* request,
                                             v1::WaitResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::vector<std::string> keys;
  for (const std::string& k : request->keys()) {
    if (absl::Status s = CheckJobAndKey(request->job_id(), k); !s.ok()) {
      reactor->Finish(ToGrpc(s));
      return reactor;
    }
    keys.push_back(FullKey(request->job_id(), k));
  }
  auto waiter = std::make_shared<Waiter>();
  const std::string prefix = StoreKeyPrefix(request->job_id());
  waiter->finish = [reactor, job = request->job_id(), prefix](absl::Status s) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      std::string message(s.message());
      for (size_t at; (at = message.find(prefix)) != std::string::npos;)
        message.erase(at, prefix.size());
      s = absl::DeadlineExceededError(absl::StrCat("job ", job, ": ", message));
    }
    reactor->Finish(ToGrpc(s));
  };
  const absl::Time deadline = CallDeadline(context, request->timeout_ms(), limits_.longest_wait);
  AwaitKeys(waiter, std::move(keys), deadline);
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Barrier(grpc::CallbackServerContext* context,
                                                const v1::BarrierRequest* request,
                                                v1::BarrierResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string name = request->name();
  if (absl::Status s = CheckJobAndKey(request->job_id(), name); !s.ok()) {
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  if (request->count() < 1 || name.find('/') != std::string::npos) {
    reactor->Finish(ToGrpc(absl::InvalidArgumentError(absl::StrCat(
        "job ", request->job_id(), ": barrier '", name,
        "' needs a count >= 1 and a name without '/', got count ", request->count()))));
    return reactor;
  }
  const std::string prefix = FullKey(request->job_id(), absl::StrCat(kBarrierKeyPrefix, name, "/"));
  auto waiter = std::make_shared<Waiter>();
  waiter->finish = [reactor, job = request->job_id(), name,
                    count = request->count()](absl::Status s) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      s = absl::DeadlineExceededError(absl::StrCat(
          "job ", job, ": barrier '", name, "' did not reach ", count, " participants in time"));
    }
    reactor->Finish(ToGrpc(s));
  };
  {
    absl::MutexLock lock(&mu_);
    BarrierState& state = barriers_[prefix];
    if (state.waiters.empty()) {
      // Participants that arrived before anyone waited are in the store.
      for (const KeyValue& kv : kv_->Range(prefix))
        state.arrived.insert(kv.key.substr(prefix.size()));
    }
    state.waiters.emplace_back(request->count(), waiter);
  }
  const absl::Time deadline = CallDeadline(context, request->timeout_ms(), limits_.longest_wait);
  timers_.Schedule(deadline, [this, prefix, waiter] {
    {
      // Forget the waiter, so a barrier that never completes does not keep it.
      absl::MutexLock lock(&mu_);
      auto state = barriers_.find(prefix);
      if (state != barriers_.end()) {
        auto& waiters = state->second.waiters;
        waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                     [&](const auto& w) { return w.second == waiter; }),
                      waiters.end());
        if (waiters.empty()) barriers_.erase(state);
      }
    }
    waiter->Complete(absl::DeadlineExceededError(""));
  });
  kv_->Commit({KvOp::Put(prefix + absl::StrCat(request->participant()), "1")},
              [waiter](absl::StatusOr<CommitResult> r) {
                if (!r.ok()) waiter->Complete(r.status());
              });
  return reactor;
}

void StoreService::Shutdown() {
  std::vector<std::shared_ptr<Waiter>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, w] : by_key_) all.push_back(w);
    by_key_.clear();
    for (auto& [prefix, state] : barriers_) {
      for (auto& [count, w] : state.waiters) all.push_back(w);
    }
    barriers_.clear();
  }
  for (const auto& w : all) w->Complete(absl::UnavailableError("zerod is shutting down; retry"));
}

}  // namespace zerod::server
