#include "server/state/state_store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/state/etcd_kv_store.h"
#include "server/state/state_dir.h"

namespace zerod::server {

absl::Status CheckStoreFlag(const std::string& store) {
  if (store == "sqlite") return absl::OkStatus();
  if (absl::StartsWith(store, "etcd://")) {
    absl::StatusOr<EtcdOptions> etcd = ParseEtcdUrl(store);
    if (!etcd.ok())
      return absl::InvalidArgumentError(absl::StrCat("--store: ", etcd.status().message()));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--store: expected sqlite or etcd://host:port[,host:port...][/prefix], got '",
                   store.substr(0, 64), "'"));
}

absl::StatusOr<EtcdOptions> EtcdOptionsOf(const std::string& store, const EtcdTls& tls) {
  absl::StatusOr<EtcdOptions> etcd = ParseEtcdUrl(store);
  if (!etcd.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--store: ", etcd.status().message()));
  }
  etcd->tls = tls;
  return etcd;
}

absl::StatusOr<OpenedState> OpenStateStore(const StateStoreOptions& options,
                                           std::unique_ptr<EtcdClaim> claim) {
  if (absl::Status s = CheckStoreFlag(options.store); !s.ok()) return s;
  OpenedState opened;
  if (options.store == "sqlite") {
    auto kv =
        OpenStateDir(options.data_dir, StateDirOptions{options.durability, options.reset_state});
    if (!kv.ok()) return kv.status();
    opened.kv = *std::move(kv);
    opened.where = StateDatabasePath(options.data_dir);
    return opened;
  }
  if (options.reset_state) {
    return absl::InvalidArgumentError(
        "--reset-state moves the SQLite state aside; an etcd state is removed with etcdctl (del "
        "--prefix), not by zerod");
  }
  absl::StatusOr<EtcdOptions> etcd = EtcdOptionsOf(options.store, options.etcd_tls);
  if (!etcd.ok()) return etcd.status();
  if (claim == nullptr) {
    return absl::FailedPreconditionError(
        "an etcd state is opened only by the holder of its claim (server/cluster/member.h)");
  }
  // Fenced: once another member holds the claim, this store writes nothing more.
  etcd->fence_key = claim->key();
  etcd->fence_create_revision = claim->create_revision();
  etcd->max_txn_ops = options.etcd_max_txn_ops;
  opened.claim = std::move(claim);
  auto kv = EtcdKvStore::Open(*etcd);
  if (!kv.ok()) return kv.status();
  opened.kv = *std::move(kv);
  std::string endpoints;
  for (const std::string& e : etcd->endpoints)
    absl::StrAppend(&endpoints, endpoints.empty() ? "" : ",", e);
  opened.where = absl::StrCat("etcd at ", endpoints, " prefix ", etcd->prefix);
  return opened;
}

}  // namespace zerod::server
