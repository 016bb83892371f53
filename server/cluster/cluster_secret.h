#ifndef ZEROD_SERVER_CLUSTER_CLUSTER_SECRET_H_
#define ZEROD_SERVER_CLUSTER_CLUSTER_SECRET_H_

// The secret the members of one cluster (zerods sharing an etcd prefix) share, kept in etcd beside
// the prefix ("/zerod/" -> "/zerod.cluster-secret"): made by the first member that finds none,
// read by every other. A follower adds it to the calls it forwards so the leader can tell them
// from a caller on its TCP port (proto/auth_metadata.h). Whoever can read etcd can read it; they
// could rewrite the state itself, so it gives them nothing more.

#include <string>

#include "absl/status/statusor.h"
#include "server/state/etcd_kv_store.h"

namespace zerod::server::cluster {

absl::StatusOr<std::string> LoadOrCreateClusterSecret(const EtcdOptions& etcd);

}  // namespace zerod::server::cluster

#endif  // ZEROD_SERVER_CLUSTER_CLUSTER_SECRET_H_
