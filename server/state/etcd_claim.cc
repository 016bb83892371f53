#include "server/state/etcd_claim.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/logging.h"
#include "server/state/etcd_kv_store.h"
#include "server/state/internal/etcd_client.h"

namespace zerod::server {

std::string KeyBesidePrefix(const std::string& prefix, const std::string& suffix) {
  std::string base = prefix;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + suffix;
}

std::string EtcdClaim::KeyFor(const std::string& prefix) {
  return KeyBesidePrefix(prefix, ".claim");
}

absl::StatusOr<ClaimAttempt> EtcdClaim::TryAcquire(const EtcdOptions& etcd,
                                                   const EtcdClaimOptions& options,
                                                   std::function<void()> on_lost) {
  auto client = internal::EtcdClient::Connect(etcd);
  if (!client.ok()) return client.status();
  const std::string key = KeyFor(etcd.prefix);
  // etcd counts a TTL in whole seconds and raises one below its minimum.
  const int64_t ttl_seconds =
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(options.ttl, absl::Seconds(1))));
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(ttl_seconds);
  etcdserverpb::LeaseGrantResponse granted;
  if (grpc::Status s = (*client)->LeaseGrant(grant, &granted); !s.ok()) {
    return (*client)->Error(s, "granting the claim's lease");
  }
  const int64_t lease = granted.id();

  // Put the key only where nobody holds it; otherwise read who does.
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(options.holder);
  put->set_lease(lease);
  txn.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  grpc::Status s = (*client)->Txn(txn, &response);
  if (s.ok() && response.succeeded()) {
    return ClaimAttempt{std::unique_ptr<EtcdClaim>(new EtcdClaim(
                            *std::move(client), key, lease, response.header().revision(),
                            absl::Seconds(granted.ttl()), std::move(on_lost))),
                        ""};
  }
  // Not ours (or unknown): the lease goes, so that a key put by a Txn whose answer was lost
  // disappears with it.
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(lease);
  etcdserverpb::LeaseRevokeResponse revoked;
  (void)(*client)->LeaseRevoke(revoke, &revoked);
  if (!s.ok()) return (*client)->Error(s, "claiming the state");
  ClaimAttempt held;
  if (response.responses_size() == 1 && response.responses(0).response_range().kvs_size() == 1) {
    held.holder = response.responses(0).response_range().kvs(0).value();
  }
  return held;
}

absl::Status EtcdClaim::SetHolder(const std::string& holder) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* mine = txn.add_compare();
  mine->set_key(key_);
  mine->set_target(etcdserverpb::Compare::CREATE);
  mine->set_result(etcdserverpb::Compare::EQUAL);
  mine->set_create_revision(create_revision_);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key_);
  put->set_value(holder);
  put->set_lease(lease_);
  etcdserverpb::TxnResponse response;
  if (grpc::Status s = client_->Txn(txn, &response); !s.ok()) {
    return client_->Error(s, "updating the claim");
  }
  if (!response.succeeded()) {
    return absl::FailedPreconditionError(
        absl::StrCat(client_->where(), ": the claim ", key_, " is no longer this daemon's"));
  }
  return absl::OkStatus();
}

EtcdClaim::EtcdClaim(std::unique_ptr<internal::EtcdClient> client, std::string key, int64_t lease,
                     int64_t create_revision, absl::Duration ttl, std::function<void()> on_lost)
    : client_(std::move(client)),
      key_(std::move(key)),
      lease_(lease),
      create_revision_(create_revision),
      ttl_(ttl),
      on_lost_(std::move(on_lost)) {
  renewer_ = std::thread([this] { RenewLoop(); });
}

EtcdClaim::~EtcdClaim() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  renewer_.join();
  // Freed at once, not one TTL later: a successor (this daemon restarted, or another machine's)
  // need not wait.
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(lease_);
  etcdserverpb::LeaseRevokeResponse revoked;
  if (grpc::Status s = client_->LeaseRevoke(revoke, &revoked); !s.ok()) {
    Logger("state")->warn("{}: the claim {} lapses by itself within {}",
                          std::string(client_->Error(s, "revoking the claim").message()), key_,
                          absl::FormatDuration(ttl_));
  }
}

absl::StatusOr<int64_t> EtcdClaim::RenewOnce() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + ttl_ / 3));
  auto stream = client_->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease_);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool answered = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  grpc::Status s = stream->Finish();
  if (!answered) {
    return client_->Error(s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "no answer") : s,
                          "renewing the claim");
  }
  return response.ttl();
}

void EtcdClaim::RenewLoop() {
  auto log = Logger("state");
  absl::Time renewed = absl::Now();
  absl::Time next = renewed + ttl_ / 3;
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; },
                                next)) {
        return;
      }
    }
    absl::StatusOr<int64_t> ttl = RenewOnce();
    if (ttl.ok() && *ttl > 0) {
      renewed = absl::Now();
      next = renewed + ttl_ / 3;
      continue;
    }
    if (!ttl.ok() && absl::Now() - renewed < ttl_) {
      log->warn("{}; retrying", std::string(ttl.status().message()));
      next = absl::Now() + absl::Milliseconds(200);
      continue;
    }
    // Expired (etcd says so), or not renewed for a whole TTL: another daemon may hold it now.
    log->error("{}: the claim {} is lost ({}); this daemon stops serving the state",
               client_->where(), key_,
               ttl.ok() ? "etcd expired its lease" : std::string(ttl.status().message()));
    on_lost_();
    return;
  }
}

absl::StatusOr<std::unique_ptr<ClaimWatch>> ClaimWatch::Start(const EtcdOptions& etcd,
                                                              std::string followed,
                                                              absl::Duration interval,
                                                              std::function<void()> changed) {
  auto client = internal::EtcdClient::Connect(etcd);
  if (!client.ok()) return client.status();
  return std::unique_ptr<ClaimWatch>(
      new ClaimWatch(*std::move(client), EtcdClaim::KeyFor(etcd.prefix), std::move(followed),
                     interval, std::move(changed)));
}

ClaimWatch::ClaimWatch(std::unique_ptr<internal::EtcdClient> client, std::string key,
                       std::string followed, absl::Duration interval, std::function<void()> changed)
    : client_(std::move(client)),
      key_(std::move(key)),
      followed_(std::move(followed)),
      interval_(interval),
      changed_(std::move(changed)) {
  poller_ = std::thread([this] { PollLoop(); });
}

ClaimWatch::~ClaimWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  poller_.join();
}

void ClaimWatch::PollLoop() {
  bool said_unavailable = false;
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; },
                               interval_)) {
        return;
      }
    }
    etcdserverpb::RangeRequest range;
    range.set_key(key_);
    etcdserverpb::RangeResponse response;
    if (grpc::Status s = client_->Range(range, &response); !s.ok()) {
      if (!said_unavailable) {
        Logger("cluster")->warn("{}; still following the leader",
                                std::string(client_->Error(s, "reading the claim").message()));
        said_unavailable = true;
      }
      continue;
    }
    said_unavailable = false;
    if (response.kvs_size() == 1 && response.kvs(0).value() == followed_) continue;
    changed_();
    return;
  }
}

}  // namespace zerod::server
