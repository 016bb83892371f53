#ifndef ZEROD_SERVER_AUTH_TRANSPORT_SECURITY_H_
#define ZEROD_SERVER_AUTH_TRANSPORT_SECURITY_H_

// How the TCP listener is secured. Tokens travel in call metadata, so on any network a listener
// must encrypt: a TCP address other than loopback needs TLS unless the operator says explicitly
// that the network is trusted (--allow-plaintext-tcp). The Unix socket is local and stays plain;
// who may connect to it is its file mode and group.

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace zerod::server::auth {

struct TlsFiles {
  std::string cert;       // PEM certificate chain of the daemon
  std::string key;        // its PEM private key
  std::string client_ca;  // optional: require client certificates signed by this CA
  bool enabled() const { return !cert.empty() || !key.empty() || !client_ca.empty(); }
};

// Whether `listen` (HOST:PORT) is a loopback address: 127.0.0.0/8, [::1] or localhost.
bool IsLoopback(const std::string& listen);

// INVALID_ARGUMENT, one line naming the flag, when the TCP listener would be plaintext off
// loopback without `allow_plaintext`, or TLS is half configured.
absl::Status CheckTcpSecurity(const std::string& listen, const TlsFiles& tls, bool allow_plaintext);

// TLS credentials from the files, or insecure ones when TLS is off.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const TlsFiles& tls);

}  // namespace zerod::server::auth

#endif  // ZEROD_SERVER_AUTH_TRANSPORT_SECURITY_H_
