#ifndef ZEROD_PROTO_AUTH_METADATA_H_
#define ZEROD_PROTO_AUTH_METADATA_H_

// The call metadata that carries credentials to zerod (docs/ARCHITECTURE.md, "Authentication").
// Part of the wire protocol, like the .proto files: the SDK writes these keys, the daemon reads
// them.

namespace zerod::rpc {

// The job's token: the secret its launcher made (zerorun, ZEROD_JOB_TOKEN). Whoever holds it may
// act as the job's ranks, use its Store, and end it.
inline constexpr char kJobTokenMetadata[] = "zerod-job-token";
// The daemon's admin token (DATA_DIR/admin.token): may act on every job.
inline constexpr char kAdminTokenMetadata[] = "zerod-admin-token";
// The daemon's viewer token (DATA_DIR/viewer.token): may use the read-only views over TCP.
inline constexpr char kViewerTokenMetadata[] = "zerod-viewer-token";
// Added by a follower zerod to every call it forwards to its cluster's leader
// (server/cluster/member.h): how the caller reached the follower ("unix": through its socket,
// whose mode and group admitted it, as if it had come through the leader's own socket; "tcp":
// credentials decide, as on the leader's port). The leader believes it only from a TLS peer with a
// member's certificate (server/auth/cluster_members.h), never for its own sake. A follower drops
// these keys from what its callers send.
inline constexpr char kForwardedViaMetadata[] = "zerod-forwarded-via";
// Also added by a follower: the host its node is reached at (its --advertise or --listen host),
// which the leader hands a rank that came through the follower's socket (JoinResponse's
// node_address). Believed only from a member, as above.
inline constexpr char kNodeAddressMetadata[] = "zerod-node-address";

}  // namespace zerod::rpc

#endif  // ZEROD_PROTO_AUTH_METADATA_H_
