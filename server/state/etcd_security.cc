#include "server/state/etcd_security.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/logging.h"
#include "server/pem_file.h"
#include "server/state/etcd_claim.h"
#include "server/state/internal/etcd_client.h"

namespace zerod::server {
namespace {

constexpr absl::Duration kRetryInterval = absl::Milliseconds(200);

// A comparison that never holds (no key has a version below 0), on a key zerod may read.
void AddNeverTrue(etcdserverpb::TxnRequest* txn, const std::string& key) {
  etcdserverpb::Compare* never = txn->add_compare();
  never->set_key(key);
  never->set_target(etcdserverpb::Compare::VERSION);
  never->set_result(etcdserverpb::Compare::LESS);
  never->set_version(0);
}

// The access check's Txn: every key zerod reads or writes named once for reading and once for
// writing, behind a comparison that never holds.
etcdserverpb::TxnRequest AccessProbe(const std::string& prefix) {
  etcdserverpb::TxnRequest txn;
  const std::string claim = EtcdClaim::KeyFor(prefix);
  const std::string markers = CommitMarkerPrefix(prefix);
  AddNeverTrue(&txn, claim);
  for (const std::string& range : {prefix, markers}) {
    etcdserverpb::RangeRequest* read = txn.add_success()->mutable_request_range();
    read->set_key(range);
    read->set_range_end(internal::PrefixEnd(range));
    read->set_limit(1);
  }
  for (const std::string& key : {prefix, claim, markers}) {
    etcdserverpb::PutRequest* write = txn.add_success()->mutable_request_put();
    write->set_key(key);
  }
  return txn;
}

// Whether an etcd call may succeed when made again: no member answered yet (a cluster still
// starting, a member being replaced).
bool Transient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// zerod's etcd user, for messages: "zerod's user 'zerod' (the CN of --etcd-cert)".
std::string UserOf(const EtcdTls& tls) {
  if (tls.cert_pem.empty()) return "zerod (no --etcd-cert: no user)";
  return absl::StrCat("zerod's user '", CertificateCommonName(tls.cert_pem),
                      "' (the CN of --etcd-cert)");
}

// Whether etcd's authentication is off, as etcd says to a login when it is.
bool AuthenticationOff(const internal::EtcdClient& client) {
  etcdserverpb::AuthenticateRequest login;  // no name, no password: never a user
  etcdserverpb::AuthenticateResponse response;
  const grpc::Status s = client.Authenticate(login, &response);
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
         absl::StrContains(s.error_message(), "authentication is not enabled");
}

}  // namespace

absl::StatusOr<EtcdTls> LoadEtcdTls(const EtcdTlsFiles& files) {
  EtcdTls tls;
  if (files.empty()) return tls;
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--etcd-cert and --etcd-key go together: zerod authenticates to etcd with that "
        "certificate (etcd's --client-cert-auth takes its CN as the user)");
  }
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--etcd-ca: needed with --etcd-cert: the CA that signed etcd's member certificates "
        "(zerod speaks TLS to etcd when given it)");
  }
  absl::StatusOr<std::string> ca = ReadPemFile(files.ca, "--etcd-ca");
  if (!ca.ok()) return ca.status();
  tls.ca_pem = *std::move(ca);
  if (files.cert.empty()) return tls;
  absl::StatusOr<std::string> cert = ReadPemFile(files.cert, "--etcd-cert");
  if (!cert.ok()) return cert.status();
  if (CertificateCommonName(*cert).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd-cert: ", files.cert,
                     ": no certificate with a CN (subject common name) in it: etcd's "
                     "--client-cert-auth takes the CN as zerod's user"));
  }
  absl::StatusOr<std::string> key = ReadPrivateKeyFile(files.key, "--etcd-key");
  if (!key.ok()) return key.status();
  tls.cert_pem = *std::move(cert);
  tls.key_pem = *std::move(key);
  return tls;
}

std::string EtcdKeysOf(const std::string& prefix) {
  return absl::StrCat(prefix, " (prefix), ", EtcdClaim::KeyFor(prefix), ", ",
                      CommitMarkerPrefix(prefix), " (prefix)");
}

std::string EtcdOutsideKeyOf(const std::string& prefix) {
  return KeyBesidePrefix(prefix, ".outside-probe");
}

absl::Status CheckEtcdAccess(const EtcdOptions& etcd) {
  auto client = internal::EtcdClient::Connect(etcd);
  if (!client.ok()) return client.status();
  etcdserverpb::TxnResponse response;
  const grpc::Status s = (*client)->Txn(AccessProbe(etcd.prefix), &response);
  if (s.ok()) return absl::OkStatus();
  const std::string& said = s.error_message();
  if (absl::StrContains(said, "user name is empty")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-cert: ", (*client)->where(), " has authentication on but took no user from zerod ",
        etcd.tls.cert_pem.empty() ? std::string("(no --etcd-cert)")
                                  : absl::StrCat("(its certificate's CN '",
                                                 CertificateCommonName(etcd.tls.cert_pem), "')"),
        " (", said,
        "): run etcd with --client-cert-auth, and give zerod --etcd-cert with a CN that is an etcd "
        "user (docs/operators.md)"));
  }
  if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
      absl::StrContains(said, "user name not found")) {
    // etcd 3.4 says "permission denied" for a user it does not know as for a role that lacks a
    // key: both are named.
    const std::string user = CertificateCommonName(etcd.tls.cert_pem);
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-cert: ", (*client)->where(), " refused ", UserOf(etcd.tls), " access to its keys (",
        said, "): etcd needs a user '", user, "' (etcdctl user add ", user,
        " --no-password) whose role may read and write ", EtcdKeysOf(etcd.prefix),
        ": deploy/etcd/auth.sh ", etcd.prefix, " ", user, " makes both (docs/operators.md)"));
  }
  return (*client)->Error(s, "checking zerod's access to its keys");
}

EtcdConfinementCheck CheckEtcdConfinement(const EtcdOptions& etcd) {
  auto client = internal::EtcdClient::Connect(etcd);
  if (!client.ok()) return {EtcdConfinement::kUnknown, std::string(client.status().message())};
  const std::string outside = EtcdOutsideKeyOf(etcd.prefix);
  etcdserverpb::RangeRequest read;
  read.set_key(outside);
  read.set_count_only(true);
  etcdserverpb::RangeResponse read_response;
  const grpc::Status r = (*client)->Range(read, &read_response);
  etcdserverpb::TxnRequest write;
  AddNeverTrue(&write, EtcdClaim::KeyFor(etcd.prefix));
  write.add_success()->mutable_request_put()->set_key(outside);
  etcdserverpb::TxnResponse write_response;
  const grpc::Status w = (*client)->Txn(write, &write_response);
  if (r.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
      w.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return {EtcdConfinement::kConfined, ""};
  }
  if (r.ok() || w.ok()) {
    const std::string did = r.ok() && w.ok() ? "read and write" : r.ok() ? "read" : "write";
    if (AuthenticationOff(**client)) {
      return {EtcdConfinement::kAuthenticationOff,
              absl::StrCat((*client)->where(), " has authentication off (it let zerod ", did, " ",
                           outside,
                           ", outside its keys): anyone who can reach a member (with any "
                           "certificate of its CA, where it asks for one) may read and rewrite "
                           "everything the cluster keeps there (jobs, their owners' token digests, "
                           "stores, the leader's claim); turn it on as docs/operators.md says "
                           "(deploy/etcd/auth.sh)")};
    }
    return {EtcdConfinement::kRoleTooBroad,
            absl::StrCat((*client)->where(), " let ", UserOf(etcd.tls), " ", did, " ", outside,
                         ", outside its keys (", EtcdKeysOf(etcd.prefix),
                         "): its roles grant more (root, or a wider prefix), so zerod's key opens "
                         "more than this cluster's keys; give it a role of its own as "
                         "deploy/etcd/auth.sh makes")};
  }
  const grpc::Status& error = r.error_code() == grpc::StatusCode::PERMISSION_DENIED ? w : r;
  return {EtcdConfinement::kUnknown,
          std::string((*client)->Error(error, "reaching for " + outside).message())};
}

absl::Status CheckEtcdIsZerods(const EtcdOptions& etcd, absl::Duration wait, bool allow_insecure) {
  const absl::Time give_up = absl::Now() + wait;
  absl::Status access = CheckEtcdAccess(etcd);
  while (!access.ok() && Transient(access) && absl::Now() < give_up) {
    absl::SleepFor(kRetryInterval);
    access = CheckEtcdAccess(etcd);
  }
  if (!access.ok()) return access;
  EtcdConfinementCheck confinement = CheckEtcdConfinement(etcd);
  while (confinement.verdict == EtcdConfinement::kUnknown && absl::Now() < give_up) {
    absl::SleepFor(kRetryInterval);
    confinement = CheckEtcdConfinement(etcd);
  }
  if (confinement.verdict == EtcdConfinement::kConfined) return absl::OkStatus();
  const std::string what =
      confinement.verdict == EtcdConfinement::kUnknown
          ? absl::StrCat("cannot tell whether etcd keeps zerod's user to its keys (",
                         confinement.message, ")")
          : confinement.message;
  if (allow_insecure) {
    Logger("cluster")->warn("{}; running on it anyway (--allow-insecure-etcd)", what);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--store: ", what, "; or give --allow-insecure-etcd to run on it anyway"));
}

}  // namespace zerod::server
