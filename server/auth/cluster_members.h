#ifndef ZEROD_SERVER_AUTH_CLUSTER_MEMBERS_H_
#define ZEROD_SERVER_AUTH_CLUSTER_MEMBERS_H_

// Who belongs to this zerod's cluster (--store etcd, server/cluster/member.h): a TLS peer whose
// certificate chains to the cluster's CA (--cluster-ca), the CA that signs the members'
// certificates (their --tls-cert) and nobody else's. A follower presents its certificate when it
// calls its leader; the leader believes what a call says about itself as a forwarded call (how its
// caller came in, the node's address, call_auth.h) and takes a NodeHeartbeat only from such a
// peer, never because of a header. The TLS handshake has already proved that the peer holds the
// certificate's key; this checks whose certificate it is, which the listener's own check cannot
// tell when it also trusts a CA of clients (--tls-client-ca).
//
// Thread-safe. Verdicts are cached per certificate for a minute (a connection's calls present the
// same one), never past the moment a certificate of the chain expires.

#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"

typedef struct x509_store_st X509_STORE;

namespace zerod::server::auth {

class ClusterMembers {
 public:
  // From the cluster CA's PEM (one or more certificates; an intermediate may be the anchor, alone).
  // Certificates are judged at `clock`'s time (null: real time), which must outlive this.
  // INVALID_ARGUMENT naming --cluster-ca when it holds no certificate.
  static absl::StatusOr<std::unique_ptr<ClusterMembers>> FromPem(const std::string& ca_pem,
                                                                 const Clock* clock = nullptr);
  ~ClusterMembers();
  ClusterMembers(const ClusterMembers&) = delete;
  ClusterMembers& operator=(const ClusterMembers&) = delete;

  // Whether the peer certificate `leaf_pem`, with the intermediates it sent (`chain_pem`, which
  // may hold the leaf too, or be empty), chains to the cluster's CA, is valid now, and may
  // authenticate a TLS client.
  bool IsMember(absl::string_view leaf_pem, absl::string_view chain_pem) const;

  // Whether a certificate in `pem` is one of the cluster's CA certificates or chains to them,
  // whatever its purpose or dates: a CA of clients that does could sign what passes for a member.
  bool Covers(absl::string_view pem) const;

 private:
  struct Verdict {
    bool member = false;
    absl::Time until;  // when it is to be reached again
  };
  ClusterMembers(X509_STORE* store, const Clock* clock);
  Verdict Verify(absl::string_view leaf_pem, absl::string_view chain_pem, absl::Time now) const;

  X509_STORE* const store_;
  const RealClock real_clock_;
  const Clock* const clock_;
  mutable Mutex mu_;
  // SHA-256 of leaf and chain -> the verdict.
  mutable absl::flat_hash_map<std::string, Verdict> verdicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zerod::server::auth

#endif  // ZEROD_SERVER_AUTH_CLUSTER_MEMBERS_H_
