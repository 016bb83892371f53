#include "server/service/health_listener.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/logging.h"

namespace zerod::server::service {

absl::StatusOr<std::unique_ptr<HealthListener>> HealthListener::Start(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--health-listen: expected HOST:PORT like 0.0.0.0:7421, got '",
                     address.substr(0, 64), "'"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<HealthListener> listener(new HealthListener());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &listener->port_);
  listener->server_ = builder.BuildAndStart();
  if (!listener->server_ || listener->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--health-listen: cannot listen on ", address,
                                               " (address in use or not permitted?)"));
  }
  listener->SetServing(false);
  Logger("service")->info("health listening on {}:{} (grpc.health.v1 only, plaintext)",
                          address.substr(0, colon), listener->port_);
  return listener;
}

HealthListener::~HealthListener() {
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    server_->Wait();
  }
}

void HealthListener::SetServing(bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

void HealthListener::StopServing() { server_->GetHealthCheckService()->Shutdown(); }

}  // namespace zerod::server::service
