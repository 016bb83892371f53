#ifndef ZEROD_SERVER_SERVICE_HEALTH_LISTENER_H_
#define ZEROD_SERVER_SERVICE_HEALTH_LISTENER_H_

// HealthListener: a plaintext gRPC port serving only grpc.health.v1.Health (--health-listen), for
// probes that cannot speak the daemon's TLS: the kubelet's grpc: probes have no TLS and no client
// certificate, while the daemon's own TCP port requires both off loopback. It says SERVING only
// while the liveness watchdog's last probe of the daemon's loops passed (liveness_watchdog.h), so a
// livenessProbe on it restarts a daemon whose loops are stuck, and NOT_SERVING from the start of
// a drain, so a readinessProbe takes the pod out of its Service first.
//
// Owns a gRPC server (its threads); the destructor stops it.

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
}

namespace zerod::server::service {

class HealthListener {
 public:
  // `address` HOST:PORT (port 0 picks one). Starts NOT_SERVING until SetServing(true).
  static absl::StatusOr<std::unique_ptr<HealthListener>> Start(const std::string& address);
  ~HealthListener();
  HealthListener(const HealthListener&) = delete;
  HealthListener& operator=(const HealthListener&) = delete;

  int port() const { return port_; }
  void SetServing(bool serving);
  // NOT_SERVING from now on, whatever SetServing says later (the drain).
  void StopServing();

 private:
  HealthListener() = default;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace zerod::server::service

#endif  // ZEROD_SERVER_SERVICE_HEALTH_LISTENER_H_
