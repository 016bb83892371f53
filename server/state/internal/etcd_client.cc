#include "server/state/internal/etcd_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zerod::server::internal {
namespace {

// "host:port" -> "a.b.c.d:port" (gRPC's ipv4: target takes addresses only).
absl::StatusOr<std::string> ResolveEndpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", endpoint, "' is not host:port"));
  }
  const std::string host = endpoint.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("etcd endpoint '", endpoint, "': cannot resolve host: ", gai_strerror(rc)));
  }
  char address[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, address,
            sizeof(address));
  freeaddrinfo(found);
  return absl::StrCat(address, ":", port);
}

absl::StatusCode ToAbsl(grpc::StatusCode code) { return static_cast<absl::StatusCode>(code); }

}  // namespace

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  // Every key: etcd reads a range_end of "\0" as "to the end".
  return std::string(1, '\0');
}

bool IsOverMessageLimit(const grpc::Status& status) {
  return status.error_message().find("larger than max") != std::string::npos;
}

bool IsTransient(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:        // no member answered, no leader, leader changed
    case grpc::StatusCode::DEADLINE_EXCEEDED:  // request_timeout
    case grpc::StatusCode::ABORTED:
      return true;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // "too many requests" passes; a request over etcd's gRPC message limit (its
      // --max-request-bytes and 512 KiB) is refused the same way every time.
      return !IsOverMessageLimit(status);
    default:
      return false;
  }
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const std::vector<std::string>& endpoints, absl::Duration request_timeout) {
  if (endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints given");
  std::vector<std::string> addresses;
  for (const std::string& endpoint : endpoints) {
    absl::StatusOr<std::string> address = ResolveEndpoint(endpoint);
    if (!address.ok()) return address.status();
    addresses.push_back(*std::move(address));
  }
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  // A Range over a large prefix can exceed gRPC's 4 MiB default; etcd sends up to 2 GiB.
  args.SetMaxReceiveMessageSize(-1);
  // A member that comes back is tried again within a second (gRPC's default backs off to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("ipv4:", absl::StrJoin(addresses, ",")),
                                           grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(std::move(channel), absl::StrCat("etcd at ", absl::StrJoin(endpoints, ",")),
                     request_timeout));
}

EtcdClient::EtcdClient(std::shared_ptr<grpc::Channel> channel, std::string where,
                       absl::Duration request_timeout)
    : channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      watch_(etcdserverpb::Watch::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      where_(std::move(where)),
      request_timeout_(request_timeout) {}

grpc::Status EtcdClient::Range(const etcdserverpb::RangeRequest& request,
                               etcdserverpb::RangeResponse* response) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request_timeout_));
  return kv_->Range(&context, request, response);
}

grpc::Status EtcdClient::Txn(const etcdserverpb::TxnRequest& request,
                             etcdserverpb::TxnResponse* response) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request_timeout_));
  return kv_->Txn(&context, request, response);
}

std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
EtcdClient::Watch(grpc::ClientContext* context) const {
  // A member cut off from the leader ends the stream instead of going silent (etcd's
  // WithRequireLeader).
  context->AddMetadata("hasleader", "true");
  return watch_->Watch(context);
}

grpc::Status EtcdClient::LeaseGrant(const etcdserverpb::LeaseGrantRequest& request,
                                    etcdserverpb::LeaseGrantResponse* response) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request_timeout_));
  return lease_->LeaseGrant(&context, request, response);
}

grpc::Status EtcdClient::LeaseRevoke(const etcdserverpb::LeaseRevokeRequest& request,
                                     etcdserverpb::LeaseRevokeResponse* response) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request_timeout_));
  return lease_->LeaseRevoke(&context, request, response);
}

std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                         etcdserverpb::LeaseKeepAliveResponse>>
EtcdClient::LeaseKeepAlive(grpc::ClientContext* context) const {
  return lease_->LeaseKeepAlive(context);
}

bool EtcdClient::WaitForConnected(absl::Duration timeout) const {
  return channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status EtcdClient::Error(const grpc::Status& status, const std::string& what) const {
  return absl::Status(ToAbsl(status.error_code()),
                      absl::StrCat(where_, ": ", what, ": ", status.error_message()));
}

}  // namespace zerod::server::internal
