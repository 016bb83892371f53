#ifndef ZEROD_SERVER_STATE_INTERNAL_ETCD_CLIENT_H_
#define ZEROD_SERVER_STATE_INTERNAL_ETCD_CLIENT_H_

// The etcd v3 API as the etcd KvStore uses it: one gRPC channel over every member (round_robin,
// so a dead member is skipped; members forward writes to the leader), unary calls with the
// store's deadline, and the watch stream.
//
// Over TLS (EtcdTls) a member is believed when its certificate chains to the etcd CA and names one
// of the endpoints as given or as resolved (EndpointNames): one channel serves every member, so it
// cannot check each connection against its own endpoint's name; any member's certificate on
// another member's address proves nothing an attacker could use, since only members hold them.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/state/etcd_kv_store.h"

namespace zerod::server::internal {

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string PrefixEnd(std::string_view prefix);

// Whether a certificate's DNS name `pattern` ("etcd-0.etcd", "*.etcd.ns.svc") covers the host name
// `host`, case aside: a wildcard is a whole leftmost label and stands for exactly one label, as in
// RFC 6125 ("*.etcd" covers "a.etcd", not "etcd" nor "a.b.etcd").
bool NameCovers(absl::string_view pattern, absl::string_view host);

// The names a member's certificate may carry: the endpoints' hosts as given, host names and IP
// literals apart, and the addresses they resolved to.
struct EndpointNames {
  std::vector<std::string> dns;  // host names
  std::vector<std::string> ips;  // IP addresses
};
// Whether a certificate whose subject alternative names are `dns_sans` and `ip_sans` names one of
// `names`: a DNS SAN covering a host name (NameCovers), or an IP SAN equal to an address. A DNS SAN
// never matches an address, nor an IP SAN a host name.
bool CertificateNamesOneOf(const std::vector<std::string>& dns_sans,
                           const std::vector<std::string>& ip_sans, const EndpointNames& names);

// Whether a failed call may succeed when tried again (no member answered, the leader changed,
// etcd timed out); the call may or may not have been applied.
bool IsTransient(const grpc::Status& status);
// gRPC refused the message as over the receiver's limit (etcd's --max-request-bytes + 512 KiB).
bool IsOverMessageLimit(const grpc::Status& status);

class EtcdClient {
 public:
  // `endpoints` are "host:port"; a host name is resolved to IPv4 here. INVALID_ARGUMENT or
  // UNAVAILABLE when an endpoint cannot be used.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const std::vector<std::string>& endpoints, absl::Duration request_timeout,
      const EtcdTls& tls = {});
  // The same, with `options`' endpoints, request timeout and TLS.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdOptions& options);

  grpc::Status Range(const etcdserverpb::RangeRequest& request,
                     etcdserverpb::RangeResponse* response) const;
  grpc::Status Txn(const etcdserverpb::TxnRequest& request,
                   etcdserverpb::TxnResponse* response) const;
  // A watch stream on `context` (which the caller may TryCancel from another thread).
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
  Watch(grpc::ClientContext* context) const;

  // Leases, for the daemon's claim on the state (server/state/etcd_claim.h).
  grpc::Status LeaseGrant(const etcdserverpb::LeaseGrantRequest& request,
                          etcdserverpb::LeaseGrantResponse* response) const;
  grpc::Status LeaseRevoke(const etcdserverpb::LeaseRevokeRequest& request,
                           etcdserverpb::LeaseRevokeResponse* response) const;
  // A keep-alive stream on `context` (its deadline is the caller's).
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                           etcdserverpb::LeaseKeepAliveResponse>>
  LeaseKeepAlive(grpc::ClientContext* context) const;

  // A password login: used only to learn whether etcd's authentication is on (etcd answers
  // "authentication is not enabled" when it is off, whatever the name).
  grpc::Status Authenticate(const etcdserverpb::AuthenticateRequest& request,
                            etcdserverpb::AuthenticateResponse* response) const;

  // Waits up to `timeout` for a connection to some member; false when none answered.
  bool WaitForConnected(absl::Duration timeout) const;

  // "etcd at h1:p1,h2:p2", for messages.
  const std::string& where() const { return where_; }
  // `status` of a call as an absl::Status naming the endpoints: "etcd at ...: <what>: <message>".
  absl::Status Error(const grpc::Status& status, const std::string& what) const;

 private:
  EtcdClient(std::shared_ptr<grpc::Channel> channel, std::string where,
             absl::Duration request_timeout);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  const std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  const std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  const std::unique_ptr<etcdserverpb::Auth::Stub> auth_;
  const std::string where_;
  const absl::Duration request_timeout_;
};

}  // namespace zerod::server::internal

#endif  // ZEROD_SERVER_STATE_INTERNAL_ETCD_CLIENT_H_
