#ifndef ZEROD_SERVER_STATE_STATE_STORE_H_
#define ZEROD_SERVER_STATE_STATE_STORE_H_

// Where the daemon's state lives, chosen by --store: "sqlite" (the embedded default, the data
// dir's zerod.db, state_dir.h) or "etcd://host:port[,host:port...][/prefix]" (etcd_kv_store.h),
// held by one daemon at a time through an etcd claim (etcd_claim.h).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/state/etcd_claim.h"
#include "server/state/etcd_security.h"
#include "server/state/kv_store.h"
#include "server/state/sqlite_kv_store.h"

namespace zerod::server {

struct StateStoreOptions {
  std::string store = "sqlite";
  int64_t etcd_max_txn_ops = 128;  // etcd's --max-txn-ops (EtcdOptions::max_txn_ops)
  EtcdTls etcd_tls;                // the PEM of --etcd-ca, --etcd-cert, --etcd-key (LoadEtcdTls)
  std::string data_dir;
  Durability durability = Durability::kFull;  // sqlite
  bool reset_state = false;                   // sqlite
};

struct OpenedState {
  std::unique_ptr<EtcdClaim> claim;  // etcd only; released after the store closes
  std::unique_ptr<KvStore> kv;
  std::string where;  // "DIR/zerod.db" or "etcd at h:p,... prefix /zerod/", for messages
};

// INVALID_ARGUMENT, starting "--store: ", for a value that names no store (checked before any
// state is touched).
absl::Status CheckStoreFlag(const std::string& store);

// The etcd options of `store` (an etcd:// URL) with `tls`; INVALID_ARGUMENT naming --store when
// it is no etcd URL.
absl::StatusOr<EtcdOptions> EtcdOptionsOf(const std::string& store, const EtcdTls& tls);

// Opens the state. An etcd state is opened only under its claim, which the caller holds (a
// cluster member elected leader, server/cluster/member.h) and hands over: it is released after the
// store closed.
absl::StatusOr<OpenedState> OpenStateStore(const StateStoreOptions& options,
                                           std::unique_ptr<EtcdClaim> claim);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_STATE_STORE_H_
