#ifndef ZEROD_SERVER_STATE_ETCD_CLAIM_H_
#define ZEROD_SERVER_STATE_ETCD_CLAIM_H_

// The etcd claim on a state: who serves it (leads the cluster, server/cluster/member.h). The etcd
// counterpart of the data dir's flock (instance_lock.h).
//
// A daemon's JobRegistry holds its jobs in memory and answers from there, so two daemons serving
// one state would each decide alone (two plans for one generation, a rank joined twice). The claim
// is a key beside the prefix ("/zerod/" -> "/zerod.claim") holding who serves the state, attached
// to an etcd lease that this object keeps alive. A daemon that dies (kill -9, a lost machine)
// stops renewing, etcd deletes the key when the lease runs out, and another member may then take
// the state over: the state outlives the daemon and its machine.
//
// TryAcquire takes the claim when nobody holds it, else says who does. Once held, the claim is
// renewed every ttl/3; when it could not be renewed for a whole TTL, or etcd says it expired,
// someone else may hold the state now and `on_lost` runs once (the member then stops leading: it
// must not act on a state it no longer owns). The destructor revokes the lease, so a daemon that
// stops cleanly frees the state at once.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"

namespace zerod::server {

namespace internal {
class EtcdClient;
}  // namespace internal

struct EtcdOptions;

struct EtcdClaimOptions {
  absl::Duration ttl = absl::Seconds(10);
  std::string holder;  // who claims: the value others read (a member writes its node and endpoint)
};

// A key beside `prefix`, outside it ("/zerod/", ".claim" -> "/zerod.claim"): the store's mirror
// of the prefix never sees it.
std::string KeyBesidePrefix(const std::string& prefix, const std::string& suffix);

class EtcdClaim;

// One try at the claim: `claim` when it was free (now held), else `holder`, the value the
// holder wrote.
struct ClaimAttempt {
  std::unique_ptr<EtcdClaim> claim;
  std::string holder;
};

class EtcdClaim {
 public:
  static absl::StatusOr<ClaimAttempt> TryAcquire(const EtcdOptions& etcd,
                                                 const EtcdClaimOptions& options,
                                                 std::function<void()> on_lost);

  // Rewrites this claim's value (a leader that learnt its bound port); FAILED_PRECONDITION when
  // the claim is no longer this one's.
  absl::Status SetHolder(const std::string& holder);
  ~EtcdClaim();
  EtcdClaim(const EtcdClaim&) = delete;
  EtcdClaim& operator=(const EtcdClaim&) = delete;

  // The key beside `prefix` that holds its claim.
  static std::string KeyFor(const std::string& prefix);
  const std::string& key() const { return key_; }
  // The revision that created the claim key: what the store's writes are fenced on.
  int64_t create_revision() const { return create_revision_; }

 private:
  EtcdClaim(std::unique_ptr<internal::EtcdClient> client, std::string key, int64_t lease,
            int64_t create_revision, absl::Duration ttl, std::function<void()> on_lost);
  void RenewLoop();
  // One keep-alive round trip: the TTL etcd granted (0 or less: the lease is gone).
  absl::StatusOr<int64_t> RenewOnce();

  const std::unique_ptr<internal::EtcdClient> client_;
  const std::string key_;
  const int64_t lease_;
  const int64_t create_revision_;  // of the claim key as this one put it
  const absl::Duration ttl_;
  const std::function<void()> on_lost_;

  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread renewer_;
};

// Follows a claim someone else holds (a follower watching its leader): polls it every
// `interval` and runs `changed` once, on its own thread, when its value is no longer `followed`
// (released, lapsed, or taken by another). While etcd does not answer it keeps polling: the
// holder's own claim lapses then too, and the change is seen when etcd answers again.
class ClaimWatch {
 public:
  static absl::StatusOr<std::unique_ptr<ClaimWatch>> Start(const EtcdOptions& etcd,
                                                           std::string followed,
                                                           absl::Duration interval,
                                                           std::function<void()> changed);
  ~ClaimWatch();
  ClaimWatch(const ClaimWatch&) = delete;
  ClaimWatch& operator=(const ClaimWatch&) = delete;

 private:
  ClaimWatch(std::unique_ptr<internal::EtcdClient> client, std::string key, std::string followed,
             absl::Duration interval, std::function<void()> changed);
  void PollLoop();

  const std::unique_ptr<internal::EtcdClient> client_;
  const std::string key_;
  const std::string followed_;
  const absl::Duration interval_;
  const std::function<void()> changed_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_ETCD_CLAIM_H_
