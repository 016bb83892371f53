#ifndef ZEROD_SERVER_AUTH_CALL_AUTH_H_
#define ZEROD_SERVER_AUTH_CALL_AUTH_H_

// The gRPC side of authorization: the credentials a call carries (proto/auth_metadata.h), and the
// check every job-scoped handler makes before it touches the job.

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/auth/job_tokens.h"

namespace zerod::server::auth {

Credentials CredentialsOf(const grpc::CallbackServerContext& context);

// OK when `tokens` is null (authentication off) or the call may do `action` on `job_id`.
absl::Status Authorize(const JobTokens* tokens, const grpc::CallbackServerContext& context,
                       const std::string& job_id, absl::string_view action);

// For a read-only view of `job_id` (empty: every job): OK when `tokens` is null, when the call
// came through the Unix socket (its mode and group decided who may connect) or a cluster member's
// (a TLS peer with a member's certificate says so), or when JobTokens::CheckView allows the call's
// credentials.
absl::Status AuthorizeView(const JobTokens* tokens, const grpc::CallbackServerContext& context,
                           const std::string& job_id);

// For a call only the members of this daemon's cluster may make (Coordinator.NodeHeartbeat): OK
// when `tokens` is null (authentication off) or the call's TLS peer presented a member's
// certificate (auth/cluster_members.h); PERMISSION_DENIED otherwise.
absl::Status AuthorizeClusterMember(const JobTokens* tokens,
                                    const grpc::CallbackServerContext& context);

// The address the caller's node is reached at, when this daemon can know it: `own_node_address`
// for a caller of this daemon's Unix socket (it runs on this node), the one a member relayed (a TLS
// peer with a member's certificate) for a caller of that member's socket; empty for a TCP caller,
// which may run anywhere.
std::string CallerNodeAddress(const JobTokens* tokens, const grpc::CallbackServerContext& context,
                              const std::string& own_node_address);

}  // namespace zerod::server::auth

#endif  // ZEROD_SERVER_AUTH_CALL_AUTH_H_
