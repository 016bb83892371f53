#include "server/cluster/cluster_secret.h"

#include "absl/strings/str_cat.h"
#include "server/auth/token_digest.h"
#include "server/state/etcd_claim.h"
#include "server/state/internal/etcd_client.h"

namespace zerod::server::cluster {

absl::StatusOr<std::string> LoadOrCreateClusterSecret(const EtcdOptions& etcd) {
  auto client = internal::EtcdClient::Connect(etcd.endpoints, etcd.request_timeout);
  if (!client.ok()) return client.status();
  const std::string key = KeyBesidePrefix(etcd.prefix, ".cluster-secret");
  // Create it where absent, else read it: one Txn, so two first members agree on one secret.
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  const std::string made = auth::NewToken();
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(made);
  txn.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  if (grpc::Status s = (*client)->Txn(txn, &response); !s.ok()) {
    return (*client)->Error(s, "reading the cluster's secret");
  }
  if (response.succeeded()) return made;
  if (response.responses_size() != 1 || response.responses(0).response_range().kvs_size() != 1 ||
      response.responses(0).response_range().kvs(0).value().empty()) {
    return absl::DataLossError(
        absl::StrCat((*client)->where(), ": ", key, " exists but holds no secret"));
  }
  return response.responses(0).response_range().kvs(0).value();
}

}  // namespace zerod::server::cluster
