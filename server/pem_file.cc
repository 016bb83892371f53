#include "server/pem_file.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
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

// The credentials directory systemd made for this service (LoadCredential=) when `path` is in it,
// else "".
std::string ServiceCredentialsDir(const std::string& path) {
  const char* credentials = std::getenv("CREDENTIALS_DIRECTORY");
  if (credentials == nullptr || *credentials == '\0') return "";
  const std::string dir = absl::StrCat(credentials, "/");
  const bool inside = path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                      path.find("/..", dir.size() - 1) == std::string::npos;
  return inside ? std::string(credentials) : "";
}

// A private key is zerod's alone: its own file, no group or other bits. In systemd's credentials
// directory, root's file readable by its group too (the ACL mask), if the directory is as systemd
// makes it: root's, writable by root alone.
absl::Status CheckPrivate(const struct stat& st, const std::string& path, absl::string_view flag) {
  const std::string credentials = ServiceCredentialsDir(path);
  const mode_t forbidden = credentials.empty() ? 077 : 007;
  struct stat dir {};
  if (!credentials.empty() && (stat(credentials.c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode) ||
                               dir.st_uid != 0 || (dir.st_mode & 022) != 0)) {
    return Refused(flag, path,
                   absl::StrCat("$CREDENTIALS_DIRECTORY ", credentials,
                                " is not root's alone (owner, mode): not systemd's credentials "
                                "directory, so the key must be zerod's alone (chmod 0600)"));
  }
  if (st.st_uid != geteuid() && !(!credentials.empty() && st.st_uid == 0)) {
    return Refused(flag, path,
                   absl::StrCat("owned by uid ", st.st_uid, ", not zerod's (uid ", geteuid(),
                                "): a private key must be zerod's alone"));
  }
  if ((st.st_mode & forbidden) != 0) {
    return Refused(flag, path,
                   absl::StrFormat("mode %04o lets others read it: a private key must be zerod's "
                                   "alone (chmod 0600)",
                                   st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Read(const std::string& path, absl::string_view flag,
                                 bool private_key) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Refused(flag, path, absl::StrCat("cannot read: ", std::strerror(errno)));
  struct stat st {};
  absl::StatusOr<std::string> text =
      fstat(fd, &st) != 0 ? Refused(flag, path, std::strerror(errno)) : ReadPem(fd, st, path, flag);
  close(fd);
  if (!text.ok() || !private_key) return text;
  if (absl::Status s = CheckPrivate(st, path, flag); !s.ok()) return s;
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag) {
  return Read(path, flag, /*private_key=*/false);
}

absl::StatusOr<std::string> ReadPrivateKeyFile(const std::string& path, absl::string_view flag) {
  return Read(path, flag, /*private_key=*/true);
}

std::string CertificateCommonName(absl::string_view pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return "";
  X509* certificate = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  std::string name;
  const X509_NAME* subject = certificate == nullptr ? nullptr : X509_get_subject_name(certificate);
  const int at = subject == nullptr ? -1 : X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  const ASN1_STRING* cn =
      at < 0 ? nullptr : X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
  if (cn != nullptr) {
    name.assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(cn)),
                static_cast<size_t>(ASN1_STRING_length(cn)));
  }
  X509_free(certificate);
  ERR_clear_error();
  return name;
}

}  // namespace zerod::server
