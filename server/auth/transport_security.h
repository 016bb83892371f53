#ifndef ZEROD_SERVER_AUTH_TRANSPORT_SECURITY_H_
#define ZEROD_SERVER_AUTH_TRANSPORT_SECURITY_H_

// How the TCP listener is secured. Tokens travel in call metadata, so on any network a listener
// must encrypt: a TCP address other than loopback needs TLS unless the operator says explicitly
// that the network is trusted (--allow-plaintext-tcp). The Unix socket is local and stays plain;
// who may connect to it is its file mode and group.
//
// In an etcd cluster the members speak mutual TLS to one another (cluster_members.h): each one's
// --tls-cert is signed by the cluster's CA (--cluster-ca), serves its listener and authenticates
// it to its leader.

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace zerod::server::auth {

// The TLS flags: files, as given (empty: not given).
struct TlsFiles {
  std::string cert;       // --tls-cert: PEM certificate chain of the daemon
  std::string key;        // --tls-key: its PEM private key
  std::string client_ca;  // --tls-client-ca: optional, require client certificates of this CA
  // --cluster-ca: an etcd cluster's CA, which signs its members' certificates (`cert`) and nobody
  // else's: the listener asks for client certificates and verifies them against it (and client_ca).
  std::string cluster_ca;
  bool enabled() const {
    return !cert.empty() || !key.empty() || !client_ca.empty() || !cluster_ca.empty();
  }
};

// Their PEM contents, read once at start (LoadTls).
struct TlsPem {
  std::string cert;
  std::string key;
  std::string client_ca;
  std::string cluster_ca;
  bool enabled() const { return !cert.empty(); }
};

// Reads the files, each once: the key must be zerod's alone (server/pem_file.h). INVALID_ARGUMENT
// naming the flag when a file cannot be read, the flags do not go together (--tls-cert with
// --tls-key; the CAs need both), or a certificate of --tls-client-ca is, or chains to, one of
// --cluster-ca (every client with a certificate could then pass for a member).
absl::StatusOr<TlsPem> LoadTls(const TlsFiles& files);

// Whether `listen` (HOST:PORT) is a loopback address: 127.0.0.0/8, [::1] or localhost.
bool IsLoopback(const std::string& listen);

// INVALID_ARGUMENT, one line naming the flag, when the TCP listener would be plaintext off
// loopback without `allow_plaintext`.
absl::Status CheckTcpSecurity(const std::string& listen, const TlsPem& tls, bool allow_plaintext);

// TLS credentials for the listener, or insecure ones when TLS is off.
std::shared_ptr<grpc::ServerCredentials> TcpCredentials(const TlsPem& tls);

// What a cluster member presents to its leader: its certificate and key, trusting a leader whose
// certificate chains to cluster_ca. The leader's host name is not checked: the cluster's CA signs
// members only, and every member may lead, so the chain says all a name would (and one DaemonSet
// certificate serves every node).
std::shared_ptr<grpc::ChannelCredentials> MemberCredentials(const TlsPem& tls);

}  // namespace zerod::server::auth

#endif  // ZEROD_SERVER_AUTH_TRANSPORT_SECURITY_H_
