#ifndef ZEROD_SERVER_TLS_CHANNEL_H_
#define ZEROD_SERVER_TLS_CHANNEL_H_

// TLS channel credentials that trust one CA of our choosing, present a client certificate when
// given one, and let `verifier` (not gRPC's host name check) decide whether a server certificate
// already chained to that CA is the one meant: the etcd client (a member's name among the
// endpoints) and a cluster member calling its leader (any member) both need that.

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_verifier.h>

#include <memory>
#include <string>

namespace zerod::server {

// `cert_pem` and `key_pem` empty: no client certificate.
std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(
    const std::string& ca_pem, const std::string& cert_pem, const std::string& key_pem,
    std::shared_ptr<grpc::experimental::CertificateVerifier> verifier);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_TLS_CHANNEL_H_
