#include "server/tls_channel.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <utility>
#include <vector>

namespace zerod::server {

std::shared_ptr<grpc::ChannelCredentials> TlsChannelCredentials(
    const std::string& ca_pem, const std::string& cert_pem, const std::string& key_pem,
    std::shared_ptr<grpc::experimental::CertificateVerifier> verifier) {
  std::vector<grpc::experimental::IdentityKeyCertPair> identity;
  if (!cert_pem.empty()) identity.push_back({key_pem, cert_pem});
  auto provider =
      std::make_shared<grpc::experimental::StaticDataCertificateProvider>(ca_pem, identity);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(std::move(provider));
  options.watch_root_certs();
  if (!identity.empty()) options.watch_identity_key_cert_pairs();
  // The chain to `ca_pem` is always checked; the name, by `verifier` instead of the call's host.
  options.set_verify_server_certs(true);
  options.set_check_call_host(false);
  options.set_certificate_verifier(std::move(verifier));
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace zerod::server
