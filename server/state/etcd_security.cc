#include "server/state/etcd_security.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/pem_file.h"
#include "server/state/etcd_claim.h"
#include "server/state/internal/etcd_client.h"

namespace zerod::server {
namespace {

// The Txn of the header: every key zerod reads or writes named once for reading and once for
// writing, behind a comparison that never holds (no key has a version below 0).
etcdserverpb::TxnRequest AccessProbe(const std::string& prefix) {
  etcdserverpb::TxnRequest txn;
  const std::string claim = EtcdClaim::KeyFor(prefix);
  const std::string markers = CommitMarkerPrefix(prefix);
  etcdserverpb::Compare* never = txn.add_compare();
  never->set_key(claim);
  never->set_target(etcdserverpb::Compare::VERSION);
  never->set_result(etcdserverpb::Compare::LESS);
  never->set_version(0);
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

absl::Status CheckEtcdAccess(const EtcdOptions& etcd) {
  auto client = internal::EtcdClient::Connect(etcd);
  if (!client.ok()) return client.status();
  etcdserverpb::TxnResponse response;
  const grpc::Status s = (*client)->Txn(AccessProbe(etcd.prefix), &response);
  if (s.ok()) return absl::OkStatus();
  const std::string& said = s.error_message();
  if (absl::StrContains(said, "user name is empty")) {
    return absl::PermissionDeniedError(absl::StrCat(
        (*client)->where(), " has authentication on but took no user from zerod's certificate (",
        said,
        "): run etcd with --client-cert-auth, and give zerod --etcd-cert with a CN that is an etcd "
        "user (docs/operators.md)"));
  }
  if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
      absl::StrContains(said, "user name not found")) {
    return absl::PermissionDeniedError(absl::StrCat(
        (*client)->where(), " refused zerod's user (the CN of --etcd-cert) access to its keys (",
        said, "): grant its role readwrite on ", EtcdKeysOf(etcd.prefix), " (docs/operators.md)"));
  }
  return (*client)->Error(s, "checking zerod's access to its keys");
}

std::vector<std::string> EtcdEndpointsOpenToAnyone(const EtcdOptions& etcd,
                                                   absl::Duration timeout) {
  std::vector<std::string> open;
  // Only the CA: an anonymous client (the CA certificate is public).
  const EtcdTls anonymous{.ca_pem = etcd.tls.ca_pem};
  const etcdserverpb::TxnRequest probe = AccessProbe(etcd.prefix);
  for (const std::string& endpoint : etcd.endpoints) {
    auto client = internal::EtcdClient::Connect({endpoint}, timeout, anonymous);
    if (!client.ok()) continue;
    etcdserverpb::TxnResponse response;
    if ((*client)->Txn(probe, &response).ok()) open.push_back(endpoint);
  }
  return open;
}

}  // namespace zerod::server
