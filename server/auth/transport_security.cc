#include "server/auth/transport_security.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_verifier.h>

#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/auth/cluster_members.h"
#include "server/pem_file.h"
#include "server/tls_channel.h"

namespace zerod::server::auth {
namespace {

// Reads `path` (given for `flag`) into `*pem`, unless no path was given.
absl::Status ReadInto(const std::string& path, const char* flag, std::string* pem) {
  if (path.empty()) return absl::OkStatus();
  auto read = ReadPemFile(path, flag);
  if (!read.ok()) return read.status();
  *pem = *std::move(read);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TlsPem> LoadTls(const TlsFiles& files) {
  TlsPem pem;
  if (!files.enabled()) return pem;
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (and --tls-client-ca and --cluster-ca need "
        "both)");
  }
  for (const auto& [path, flag, into] :
       {std::tuple{files.cert, "--tls-cert", &pem.cert},
        std::tuple{files.client_ca, "--tls-client-ca", &pem.client_ca},
        std::tuple{files.cluster_ca, "--cluster-ca", &pem.cluster_ca}}) {
    if (absl::Status s = ReadInto(path, flag, into); !s.ok()) return s;
  }
  // The key is the listener's, and a member's credential: whoever reads it may pass for zerod.
  auto key = ReadPrivateKeyFile(files.key, "--tls-key");
  if (!key.ok()) return key.status();
  pem.key = *std::move(key);
  if (!pem.cluster_ca.empty() && !pem.client_ca.empty()) {
    auto members = ClusterMembers::FromPem(pem.cluster_ca);
    if (!members.ok()) return members.status();
    if ((*members)->Covers(pem.client_ca)) {
      return absl::InvalidArgumentError(
          "--cluster-ca: a certificate of --tls-client-ca is one of its certificates or chains "
          "to them: every client with a certificate could pass for a member of the cluster; give "
          "the members a CA of their own, which signs nothing else");
    }
  }
  return pem;
}

bool IsLoopback(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status CheckTcpSecurity(const std::string& listen, const TlsPem& tls, bool allow_plaintext) {
  if (listen.empty() || tls.enabled() || IsLoopback(listen) || allow_plaintext) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--listen ", listen,
      " is not a loopback address: give --tls-cert and --tls-key, or "
      "--allow-plaintext-tcp if the network is trusted (tokens would cross it in clear)"));
}

std::shared_ptr<grpc::ServerCredentials> TcpCredentials(const TlsPem& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({tls.key, tls.cert});
  options.pem_root_certs =
      absl::StrCat(tls.client_ca, tls.client_ca.empty() ? "" : "\n", tls.cluster_ca);
  if (!tls.client_ca.empty()) {
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  } else if (!tls.cluster_ca.empty()) {
    // Members present one; clients need none (tokens authenticate them).
    options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MemberCredentials(const TlsPem& tls) {
  return TlsChannelCredentials(tls.cluster_ca, tls.cert, tls.key,
                               std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
}

}  // namespace zerod::server::auth
