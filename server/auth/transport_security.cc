#include "server/auth/transport_security.h"

#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zerod::server::auth {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return text.str();
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
        "--tls-cert and --tls-key go together (and --tls-client-ca "
        "needs both)");
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
  auto cert = ReadPem(tls.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(tls.key, "--tls-key");
  if (!key.ok()) return key.status();
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca.empty()) {
    auto ca = ReadPem(tls.client_ca, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace zerod::server::auth
