#ifndef ZEROD_SERVER_CLUSTER_FORWARDING_SERVER_H_
#define ZEROD_SERVER_CLUSTER_FORWARDING_SERVER_H_

// ForwardingServer: what a follower zerod serves on its node's Unix socket and TCP port. Every call
// of every service (zerod.v1.Coordinator, Store, Inspect) is relayed, as opaque bytes, to the
// leader zerod over one gRPC channel, without knowing the methods: request messages go to the
// leader in order, responses come back in order, half-close, the final status (code, message,
// trailing metadata), the caller's deadline and cancellation all propagate. The caller's metadata
// (keys not starting with ':' or "grpc-", e.g. the job token) is copied to the leader call, plus
// ForwardingOptions::added_metadata. grpc.health.v1.Health is answered locally (SERVING), not
// forwarded, so probes of the node's daemon work.
//
// Flow control: at most one write in flight on each side of a call, and the next message is read
// only once the previous one was written, so a slow caller of Coordinator.Watch makes the proxy
// hold at most one response, not an unbounded queue.
//
// The leader unreachable: the caller gets UNAVAILABLE with a message naming the leader endpoint.
//
// Owns a gRPC server and a channel to the leader (their threads); Shutdown or the destructor stop
// both, cancelling calls in flight (their callers get UNAVAILABLE).

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class ChannelCredentials;
class Service;
class ServerCredentials;
}  // namespace grpc

namespace zerod::server::cluster {

struct ForwardingOptions {
  std::string socket_path;  // Unix socket to serve (empty: none); mode/group as below
  int socket_mode = 0660;
  gid_t socket_gid = static_cast<gid_t>(-1);  // chown the socket to this group when not -1
  std::string listen_address;                 // TCP to serve (empty: none)
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;  // insecure when null
  std::string leader_endpoint;  // "host:port" of the leader's TCP listener
  std::shared_ptr<grpc::ChannelCredentials> leader_credentials;  // insecure when null
  // Metadata added to every forwarded call (the lead uses it to say "forwarded by a cluster
  // member, the caller came through my Unix socket / my TCP port").
  std::vector<std::pair<std::string, std::string>> added_metadata;
  int64_t max_message_bytes = 64 << 20;
  // Services answered here instead of forwarded (a follower's HeartbeatRelay, whose Coordinator
  // service handles Heartbeat and leaves every other method generic). Not owned; they must outlive
  // the server.
  std::vector<grpc::Service*> local_services;
};

class ForwardingServer {
 public:
  // Binds the socket and/or TCP address and starts serving. The leader need not be up yet: calls
  // made while it is unreachable fail UNAVAILABLE. Fails INVALID_ARGUMENT when neither a socket
  // nor an address is given or leader_endpoint is empty, UNAVAILABLE when binding fails, and
  // PERMISSION_DENIED when the socket's mode or group cannot be set.
  static absl::StatusOr<std::unique_ptr<ForwardingServer>> Start(ForwardingOptions options);
  // Stops: in-flight calls are cancelled (UNAVAILABLE to callers).
  ~ForwardingServer();
  ForwardingServer(const ForwardingServer&) = delete;
  ForwardingServer& operator=(const ForwardingServer&) = delete;

  // Stops accepting calls, gives calls in flight up to `grace` to finish, then cancels the rest
  // (a streaming Watch ends UNAVAILABLE). Idempotent; the destructor calls it with no grace.
  void Shutdown(absl::Duration grace);
  // The bound TCP port (listen port 0 picks one); 0 when no TCP address was given.
  int tcp_port() const;
  // Calls forwarded to the leader so far (health checks answered locally are not counted).
  int64_t forwarded_calls() const;

 private:
  class Impl;
  explicit ForwardingServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerod::server::cluster

#endif  // ZEROD_SERVER_CLUSTER_FORWARDING_SERVER_H_
