#include "server/auth/call_auth.h"

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "proto/auth_metadata.h"

namespace zerod::server::auth {
namespace {

std::string Metadata(const grpc::CallbackServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// Whether the call's TLS peer is a member of this daemon's cluster (JobTokens::IsClusterMember):
// its certificate, as the handshake proved it holds, not anything the call says.
bool FromClusterMember(const JobTokens& tokens, const grpc::CallbackServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> peer = context.auth_context();
  if (peer == nullptr) return false;
  const std::vector<grpc::string_ref> leaf =
      peer->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (leaf.size() != 1) return false;
  const std::vector<grpc::string_ref> chain =
      peer->FindPropertyValues(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME);
  const auto view = [](const grpc::string_ref& s) { return absl::string_view(s.data(), s.size()); };
  return tokens.IsClusterMember(view(leaf[0]), chain.empty() ? "" : view(chain[0]));
}

}  // namespace

Credentials CredentialsOf(const grpc::CallbackServerContext& context) {
  return {Metadata(context, rpc::kJobTokenMetadata), Metadata(context, rpc::kAdminTokenMetadata),
          Metadata(context, rpc::kViewerTokenMetadata)};
}

absl::Status Authorize(const JobTokens* tokens, const grpc::CallbackServerContext& context,
                       const std::string& job_id, absl::string_view action) {
  if (tokens == nullptr) return absl::OkStatus();
  return tokens->Check(job_id, CredentialsOf(context), action);
}

absl::Status AuthorizeView(const JobTokens* tokens, const grpc::CallbackServerContext& context,
                           const std::string& job_id) {
  if (tokens == nullptr) return absl::OkStatus();
  // gRPC names a Unix-socket peer "unix:..."; every other peer (TCP, and anything gRPC might name
  // otherwise) must present a credential.
  if (absl::StartsWith(context.peer(), "unix:")) return absl::OkStatus();
  // A member's socket admitted the caller as this daemon's socket would have.
  if (Metadata(context, rpc::kForwardedViaMetadata) == "unix" &&
      FromClusterMember(*tokens, context)) {
    return absl::OkStatus();
  }
  return tokens->CheckView(job_id, CredentialsOf(context));
}

absl::Status AuthorizeClusterMember(const JobTokens* tokens,
                                    const grpc::CallbackServerContext& context) {
  if (tokens == nullptr || FromClusterMember(*tokens, context)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "only the members of this zerod's cluster (zerods on its etcd prefix, with a certificate "
      "signed by its --cluster-ca) may relay heartbeats");
}

std::string CallerNodeAddress(const JobTokens* tokens, const grpc::CallbackServerContext& context,
                              const std::string& own_node_address) {
  if (absl::StartsWith(context.peer(), "unix:")) return own_node_address;
  if (Metadata(context, rpc::kForwardedViaMetadata) != "unix") return "";
  if (tokens != nullptr && !FromClusterMember(*tokens, context)) return "";
  return Metadata(context, rpc::kNodeAddressMetadata);
}

}  // namespace zerod::server::auth
