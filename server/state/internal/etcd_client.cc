#include "server/state/internal/etcd_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "server/tls_channel.h"

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

// The bytes of an IP address in text ("10.0.0.1", "::1", "[::1]"); empty when it is none.
std::string AddressBytes(absl::string_view text) {
  std::string host(text);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned char bytes[sizeof(in6_addr)] = {};
  if (inet_pton(AF_INET, host.c_str(), bytes) == 1) return std::string(bytes, bytes + 4);
  if (inet_pton(AF_INET6, host.c_str(), bytes) == 1) return std::string(bytes, bytes + 16);
  return "";
}

std::vector<std::string> Strings(const std::vector<grpc::string_ref>& refs) {
  std::vector<std::string> out;
  for (const grpc::string_ref& r : refs) out.emplace_back(r.data(), r.size());
  return out;
}

// Believes a member whose certificate (already chained to the etcd CA by gRPC) names one of the
// endpoints (etcd_client.h says why any of them).
class EndpointNameVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  EndpointNameVerifier(EndpointNames names, std::string where)
      : names_(std::move(names)), where_(std::move(where)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    if (CertificateNamesOneOf(Strings(request->dns_names()), Strings(request->ip_names()),
                              names_)) {
      *sync_status = grpc::Status::OK;
      return true;
    }
    *sync_status = grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat(where_, ": a member's certificate names none of the endpoints (",
                     absl::StrJoin(names_.dns, ", "), names_.dns.empty() ? "" : ", ",
                     absl::StrJoin(names_.ips, ", "), ") among its subject alternative names"));
    return true;
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const EndpointNames names_;
  const std::string where_;
};

}  // namespace

bool NameCovers(absl::string_view pattern, absl::string_view host) {
  if (pattern.empty() || host.empty()) return false;
  if (absl::EqualsIgnoreCase(pattern, host)) return true;
  if (!absl::StartsWith(pattern, "*.") || pattern.size() < 3) return false;
  const size_t dot = host.find('.');
  return dot != absl::string_view::npos && dot > 0 &&
         absl::EqualsIgnoreCase(pattern.substr(1), host.substr(dot));
}

bool CertificateNamesOneOf(const std::vector<std::string>& dns_sans,
                           const std::vector<std::string>& ip_sans, const EndpointNames& names) {
  for (const std::string& san : dns_sans) {
    for (const std::string& host : names.dns) {
      if (NameCovers(san, host)) return true;
    }
  }
  for (const std::string& san : ip_sans) {
    const std::string bytes = AddressBytes(san);
    if (bytes.empty()) continue;
    for (const std::string& address : names.ips) {
      if (AddressBytes(address) == bytes) return true;
    }
  }
  return false;
}

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

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdOptions& options) {
  return Connect(options.endpoints, options.request_timeout, options.tls);
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const std::vector<std::string>& endpoints, absl::Duration request_timeout, const EtcdTls& tls) {
  if (endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints given");
  std::vector<std::string> addresses;
  EndpointNames names;  // what a member's certificate may name
  for (const std::string& endpoint : endpoints) {
    absl::StatusOr<std::string> address = ResolveEndpoint(endpoint);
    if (!address.ok()) return address.status();
    const std::string host = endpoint.substr(0, endpoint.rfind(':'));
    for (auto [list, name] : {std::pair{AddressBytes(host).empty() ? &names.dns : &names.ips, host},
                              std::pair{&names.ips, address->substr(0, address->rfind(':'))}}) {
      if (std::find(list->begin(), list->end(), name) == list->end()) list->push_back(name);
    }
    addresses.push_back(*std::move(address));
  }
  const std::string where = absl::StrCat("etcd at ", absl::StrJoin(endpoints, ","));
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("round_robin");
  // A Range over a large prefix can exceed gRPC's 4 MiB default; etcd sends up to 2 GiB.
  args.SetMaxReceiveMessageSize(-1);
  // A member that comes back is tried again within a second (gRPC's default backs off to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // TLS: etcd's CA, zerod's certificate (client-certificate authentication) when given, and the
  // endpoint-name check above instead of gRPC's per-channel host name check.
  auto credentials =
      tls.enabled()
          ? TlsChannelCredentials(
                tls.ca_pem, tls.cert_pem, tls.key_pem,
                grpc::experimental::ExternalCertificateVerifier::Create<EndpointNameVerifier>(
                    std::move(names), where))
          : grpc::InsecureChannelCredentials();
  auto channel = grpc::CreateCustomChannel(absl::StrCat("ipv4:", absl::StrJoin(addresses, ",")),
                                           credentials, args);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(channel), where, request_timeout));
}

EtcdClient::EtcdClient(std::shared_ptr<grpc::Channel> channel, std::string where,
                       absl::Duration request_timeout)
    : channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      watch_(etcdserverpb::Watch::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      auth_(etcdserverpb::Auth::NewStub(channel_)),
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

grpc::Status EtcdClient::Authenticate(const etcdserverpb::AuthenticateRequest& request,
                                      etcdserverpb::AuthenticateResponse* response) const {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + request_timeout_));
  return auth_->Authenticate(&context, request, response);
}

bool EtcdClient::WaitForConnected(absl::Duration timeout) const {
  return channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
}

absl::Status EtcdClient::Error(const grpc::Status& status, const std::string& what) const {
  // OpenSSL's words for a chain that does not reach the CA, which gRPC passes on.
  const bool untrusted = absl::StrContains(status.error_message(), "certificate verify failed");
  return absl::Status(
      ToAbsl(status.error_code()),
      absl::StrCat(
          where_, ": ", what, ": ", status.error_message(),
          untrusted ? " (a member's certificate is not signed by the CA of --etcd-ca)" : ""));
}

}  // namespace zerod::server::internal
