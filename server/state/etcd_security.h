#ifndef ZEROD_SERVER_STATE_ETCD_SECURITY_H_
#define ZEROD_SERVER_STATE_ETCD_SECURITY_H_

// Whether the etcd a zerod is given is zerod's own (docs/operators.md, "zerod on etcd"): everything
// the cluster keeps there (jobs, their owners' token digests, stores, the claim) is exactly as open
// as etcd is. zerod speaks to etcd over TLS with a client certificate (etcd's --client-cert-auth
// takes its CN as the user), etcd's role for that user covers zerod's keys, and no member may let
// in a client that has neither a certificate nor a user.
//
// The checks make one etcd Txn whose only comparison never holds: etcd checks the permission of
// every key it names (the comparison's, and the writes of both branches) before it evaluates
// anything, so the Txn proves read and write access without writing.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/state/etcd_kv_store.h"

namespace zerod::server {

// The files of --etcd-ca, --etcd-cert and --etcd-key (empty: not given).
struct EtcdTlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
  bool empty() const { return ca.empty() && cert.empty() && key.empty(); }
};

// Their PEM contents. INVALID_ARGUMENT naming the flag when a file cannot be read, the key is not
// zerod's alone (server/pem_file.h), or the flags do not go together (--etcd-cert with --etcd-key,
// both with --etcd-ca).
absl::StatusOr<EtcdTls> LoadEtcdTls(const EtcdTlsFiles& files);

// The keys zerod uses on `prefix`, for messages: "/zerod/ (prefix), /zerod.claim, /zerod.commit/
// (prefix)".
std::string EtcdKeysOf(const std::string& prefix);

// OK when etcd lets this zerod (its certificate's user) read and write its prefix, its claim and
// its commit markers. Otherwise etcd's refusal, saying what to grant (PERMISSION_DENIED), or that
// etcd takes no user from the certificate (run it with --client-cert-auth) when it says the user
// name is empty; UNAVAILABLE (and the like) while no member answers.
absl::Status CheckEtcdAccess(const EtcdOptions& etcd);

// The endpoints whose member accepted that Txn from a client with no certificate and no user
// (over TLS with etcd's CA when `etcd` uses TLS, plaintext otherwise): anyone who can reach one
// may read and rewrite zerod's state. A member that does not answer within `timeout` is not listed.
std::vector<std::string> EtcdEndpointsOpenToAnyone(const EtcdOptions& etcd, absl::Duration timeout);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_ETCD_SECURITY_H_
