#include "server/pem_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zerod::server {
namespace {

// Larger than any certificate chain or key: a flag naming a device or a huge file is refused
// instead of read forever.
constexpr size_t kMaxPemBytes = 1 << 20;

absl::Status Refused(absl::string_view flag, const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": ", why));
}

// Reads an open regular file of at most kMaxPemBytes that holds a PEM block.
absl::StatusOr<std::string> ReadPem(int fd, const struct stat& st, const std::string& path,
                                    absl::string_view flag) {
  if (!S_ISREG(st.st_mode)) return Refused(flag, path, "not a regular file");
  if (static_cast<size_t>(st.st_size) > kMaxPemBytes) {
    return Refused(flag, path, "larger than 1 MiB: not a PEM certificate or key");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Refused(flag, path, std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  if (text.find("-----BEGIN ") == std::string::npos) return Refused(flag, path, "not a PEM file");
  return text;
}

// Whether `path` is in systemd's credentials directory for this service (LoadCredential=): systemd
// makes such a file readable by the service alone, with a root owner and an ACL for the service's
// (dynamic) user, which the mode bits cannot show.
bool IsServiceCredential(const std::string& path) {
  const char* credentials = std::getenv("CREDENTIALS_DIRECTORY");
  if (credentials == nullptr || *credentials == '\0') return false;
  const std::string dir = absl::StrCat(credentials, "/");
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path.find("/..", dir.size() - 1) == std::string::npos;
}

absl::StatusOr<std::string> Read(const std::string& path, absl::string_view flag,
                                 bool private_key) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Refused(flag, path, absl::StrCat("cannot read: ", std::strerror(errno)));
  struct stat st {};
  absl::StatusOr<std::string> text =
      fstat(fd, &st) != 0 ? Refused(flag, path, std::strerror(errno)) : ReadPem(fd, st, path, flag);
  close(fd);
  if (!text.ok() || !private_key || IsServiceCredential(path)) return text;
  if (st.st_uid != geteuid()) {
    return Refused(flag, path,
                   absl::StrCat("owned by uid ", st.st_uid, ", not zerod's (uid ", geteuid(),
                                "): a private key must be zerod's alone"));
  }
  if ((st.st_mode & 077) != 0) {
    return Refused(flag, path,
                   absl::StrFormat("mode %04o lets others read it: a private key must be zerod's "
                                   "alone (chmod 0600)",
                                   st.st_mode & 07777));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag) {
  return Read(path, flag, /*private_key=*/false);
}

absl::StatusOr<std::string> ReadPrivateKeyFile(const std::string& path, absl::string_view flag) {
  return Read(path, flag, /*private_key=*/true);
}

}  // namespace zerod::server
