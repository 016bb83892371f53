#include "server/auth/token_digest.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

namespace {

// Reads the token in `path`, or makes it. `share`: set the file's mode (and group) to what `group`
// says, 0640 for a group (-1: none, 0600), rather than only check that nobody else may read it.
absl::StatusOr<std::string> LoadOrCreateToken(const std::string& path, const char* what, bool share,
                                              gid_t group) {
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
          absl::StrCat("cannot write the ", what, " ", path, ": ", std::strerror(errno)));
    }
  } else if (errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create the ", what, " ", path, ": ", std::strerror(errno)));
  }
  // Opened without following a link and judged by the open file: a token someone else planted
  // (or linked to one of theirs) would make them whatever the token lets its holder be.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        errno == ELOOP
            ? absl::StrCat(what, " ", path, " is a symbolic link; remove it")
            : absl::StrCat("cannot read the ", what, " ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string refusal;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    refusal = absl::StrCat(what, " ", path, " is not a file");
  } else if (st.st_uid != geteuid()) {
    refusal = absl::StrFormat(
        "%s %s belongs to uid %d, not to zerod's user (uid %d): someone else may have planted it; "
        "remove it and a new one is made at the next start",
        what, path, static_cast<int>(st.st_uid), static_cast<int>(geteuid()));
  } else if (share &&
             ((group != static_cast<gid_t>(-1) && fchown(fd, static_cast<uid_t>(-1), group) != 0) ||
              fchmod(fd, group == static_cast<gid_t>(-1) ? 0600 : 0640) != 0)) {
    refusal =
        absl::StrCat("cannot give the ", what, " ", path, " to its group: ", std::strerror(errno));
  } else if (fstat(fd, &st) != 0 ||
             (st.st_mode & (group == static_cast<gid_t>(-1) ? 077 : 037)) != 0) {
    refusal = absl::StrFormat("%s %s may be %s by others (mode %03o); chmod 600 it", what, path,
                              (st.st_mode & 044) != 0 ? "read" : "written", st.st_mode & 0777);
  }
  std::string text;
  char buffer[256];
  ssize_t n = 0;
  while (refusal.empty() && text.size() < 4096 && (n = read(fd, buffer, sizeof buffer)) > 0) {
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (!refusal.empty()) return absl::FailedPreconditionError(refusal);
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.size() < 32) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path,
                     " holds fewer than 32 characters; remove it and a new "
                     "one is made at the next start"));
  }
  return token;
}

}  // namespace

absl::StatusOr<std::string> LoadOrCreateAdminToken(const std::string& path) {
  return LoadOrCreateToken(path, "admin token", false, static_cast<gid_t>(-1));
}

absl::StatusOr<std::string> LoadOrCreateViewerToken(const std::string& path, gid_t group) {
  return LoadOrCreateToken(path, "viewer token", true, group);
}

}  // namespace zerod::server::auth
