#include "server/auth/token_digest.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zerod::server::auth {

std::string TokenDigest(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

bool SameDigest(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // Without randomness no token can be trusted; this is not a state to run in.
    std::abort();
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), 32));
}

absl::StatusOr<std::string> LoadOrCreateAdminToken(const std::string& path) {
  const int created = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (created >= 0) {
    const std::string token = NewToken() + "\n";
    const bool written =
        write(created, token.data(), token.size()) == static_cast<ssize_t>(token.size()) &&
        fsync(created) == 0;
    close(created);
    if (!written) {
      unlink(path.c_str());
      return absl::InternalError(
          absl::StrCat("cannot write the admin token ", path, ": ", std::strerror(errno)));
    }
  } else if (errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create the admin token ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("admin token ", path, " is not a file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "admin token %s may be read by others (mode %03o); chmod 600 it", path, st.st_mode & 0777));
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.size() < 32) {
    return absl::FailedPreconditionError(
        absl::StrCat("admin token ", path,
                     " holds fewer than 32 characters; remove it and a new "
                     "one is made at the next start"));
  }
  return token;
}

}  // namespace zerod::server::auth
