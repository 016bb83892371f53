#ifndef ZEROD_SERVER_STATE_ETCD_SECURITY_H_
#define ZEROD_SERVER_STATE_ETCD_SECURITY_H_

// Whether the etcd a zerod is given is zerod's own (docs/operators.md, "zerod on etcd"): everything
// the cluster keeps there (jobs, their owners' token digests, stores, the claim) is exactly as open
// as etcd is. zerod speaks to etcd over TLS with a client certificate (etcd's --client-cert-auth
// takes its CN as the user), etcd's authentication is on, and that user's role covers zerod's keys
// and nothing else.
//
// The checks are made as zerod's own user, never anonymously: etcd's authentication is one setting
// of the whole cluster (its auth store is replicated by raft), so the answer of the member that
// serves a request holds for every member, and with it on etcd refuses every request that carries
// no user, on every listener. Each check is one etcd request that writes nothing: a Txn whose only
// comparison never holds (etcd checks the permission of every key a Txn names, in the comparison
// and in the writes of both branches, before it evaluates anything), or a Range.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
// zerod's alone (server/pem_file.h), the certificate has no CN (etcd's user), or the flags do not
// go together (--etcd-cert with --etcd-key, both with --etcd-ca).
absl::StatusOr<EtcdTls> LoadEtcdTls(const EtcdTlsFiles& files);

// The keys zerod uses on `prefix`, for messages: "/zerod/ (prefix), /zerod.claim, /zerod.commit/
// (prefix)".
std::string EtcdKeysOf(const std::string& prefix);
// A key outside them that the confinement check reaches for: "/zerod.outside-probe".
std::string EtcdOutsideKeyOf(const std::string& prefix);

// OK when etcd lets this zerod (its certificate's user) read and write its prefix, its claim and
// its commit markers. Otherwise INVALID_ARGUMENT starting "--etcd-cert: " that names the user and
// says what etcd needs (the user, its role's grants, or --client-cert-auth); UNAVAILABLE (and the
// like) while no member answers.
absl::Status CheckEtcdAccess(const EtcdOptions& etcd);

// What etcd does when zerod's user reads, or writes, the key outside its keys.
enum class EtcdConfinement {
  kConfined,           // refused both (PERMISSION_DENIED): authentication on, the role is zerod's
  kAuthenticationOff,  // let zerod in, and etcd's authentication is off: anyone may
  kRoleTooBroad,       // let zerod in under a role wider than its keys (root, a wider prefix)
  kUnknown,            // no answer, or an error that says neither
};
struct EtcdConfinementCheck {
  EtcdConfinement verdict = EtcdConfinement::kUnknown;
  std::string message;  // what etcd did, naming it; empty when confined
};
EtcdConfinementCheck CheckEtcdConfinement(const EtcdOptions& etcd);

// Both checks, as a cluster member makes them before it uses etcd: OK, or why not. Waits up to
// `wait` while etcd does not answer (UNAVAILABLE and the like after it). An etcd that lets zerod
// out of its keys, or whose confinement stays unknown after `wait`, is refused (INVALID_ARGUMENT
// starting "--store: ") unless `allow_insecure`, which logs a warning instead.
absl::Status CheckEtcdIsZerods(const EtcdOptions& etcd, absl::Duration wait, bool allow_insecure);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_ETCD_SECURITY_H_
