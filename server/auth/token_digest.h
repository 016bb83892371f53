#ifndef ZEROD_SERVER_AUTH_TOKEN_DIGEST_H_
#define ZEROD_SERVER_AUTH_TOKEN_DIGEST_H_

// Tokens as the daemon keeps them: only their SHA-256, compared in constant time. Tokens are 256
// random bits (zerorun, the SDK and the admin token file make them so), so a plain hash is enough:
// there is nothing to guess that a slow password hash would protect.

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod::server::auth {

// The SHA-256 of `token`, as 64 hex digits.
std::string TokenDigest(absl::string_view token);

// Whether two digests are equal, in time that does not depend on where they differ.
bool SameDigest(absl::string_view a, absl::string_view b);

// A new token: 32 random bytes from OpenSSL's CSPRNG, as 64 hex digits.
std::string NewToken();

// The admin token in `path`: read it, or create it (0600, a new token) when there is none. A token
// file that others may read or write, that another user owns, or that is a symbolic link is
// refused: anyone who can read it is an admin, anyone who could plant it would choose the admin.
absl::StatusOr<std::string> LoadOrCreateAdminToken(const std::string& path);

// The viewer token (read-only inspection over TCP, docs/ARCHITECTURE.md "Authentication and
// authorization"): as the admin token, but its mode is set at every start: given to `group` and
// 0640 when `group` is not -1 (--viewer-group: its members can read it, nobody else), else 0600.
absl::StatusOr<std::string> LoadOrCreateViewerToken(const std::string& path, gid_t group);

}  // namespace zerod::server::auth

#endif  // ZEROD_SERVER_AUTH_TOKEN_DIGEST_H_
