#include "server/auth/transport_security.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/pem_file.h"

namespace zerod::server::auth {
namespace {

// The PEM certificates of `pem` as their base64 bodies, to compare two files' certificates.
std::vector<std::string> CertificateBodies(const std::string& pem) {
  std::vector<std::string> bodies;
  const std::string kBegin = "-----BEGIN CERTIFICATE-----";
  const std::string kEnd = "-----END CERTIFICATE-----";
  for (size_t at = pem.find(kBegin); at != std::string::npos; at = pem.find(kBegin, at + 1)) {
    const size_t end = pem.find(kEnd, at);
    if (end == std::string::npos) break;
    std::string body = pem.substr(at + kBegin.size(), end - at - kBegin.size());
    body.erase(std::remove_if(body.begin(), body.end(), absl::ascii_isspace), body.end());
    bodies.push_back(std::move(body));
  }
  return bodies;
}

}  // namespace

bool IsLoopback(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status CheckTcpSecurity(const std::string& listen, const TlsFiles& tls,
                              bool allow_plaintext) {
  if (listen.empty()) return absl::OkStatus();
  if (tls.enabled() && (tls.cert.empty() || tls.key.empty())) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (and --tls-client-ca and --cluster-ca need "
        "both)");
  }
  if (!tls.enabled() && !IsLoopback(listen) && !allow_plaintext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", listen,
        " is not a loopback address: give --tls-cert and --tls-key, or "
        "--allow-plaintext-tcp if the network is trusted (tokens would cross it in clear)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  auto cert = ReadPemFile(tls.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(tls.key, "--tls-key");
  if (!key.ok()) return key.status();
  options.pem_key_cert_pairs.push_back({*key, *cert});
  std::string client_ca, cluster_ca;
  if (!tls.client_ca.empty()) {
    auto ca = ReadPemFile(tls.client_ca, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    client_ca = *std::move(ca);
  }
  if (!tls.cluster_ca.empty()) {
    auto ca = ReadPemFile(tls.cluster_ca, "--cluster-ca");
    if (!ca.ok()) return ca.status();
    cluster_ca = *std::move(ca);
  }
  for (const std::string& body : CertificateBodies(cluster_ca)) {
    const std::vector<std::string> clients = CertificateBodies(client_ca);
    if (std::find(clients.begin(), clients.end(), body) != clients.end()) {
      return absl::InvalidArgumentError(
          "--cluster-ca: a certificate in it is also in --tls-client-ca: every client with a "
          "certificate could pass for a member of the cluster; give the members a CA of their own");
    }
  }
  options.pem_root_certs = absl::StrCat(client_ca, client_ca.empty() ? "" : "\n", cluster_ca);
  if (!client_ca.empty()) {
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  } else if (!cluster_ca.empty()) {
    // Members present one; clients need none (tokens authenticate them).
    options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MemberCredentials(const TlsFiles& tls) {
  auto cert = ReadPemFile(tls.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPrivateKeyFile(tls.key, "--tls-key");
  if (!key.ok()) return key.status();
  auto ca = ReadPemFile(tls.cluster_ca, "--cluster-ca");
  if (!ca.ok()) return ca.status();
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      *ca, std::vector<grpc::experimental::IdentityKeyCertPair>{{*key, *cert}});
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_check_call_host(false);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace zerod::server::auth
