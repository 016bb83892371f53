#ifndef ZEROD_SERVER_PEM_FILE_H_
#define ZEROD_SERVER_PEM_FILE_H_

// PEM files named by flags (--tls-cert, --etcd-ca, ...), read once at start with errors that name
// the flag and the file.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod::server {

// The file's contents; INVALID_ARGUMENT "FLAG: ..." when it cannot be read or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag);

// As ReadPemFile, for a private key that must be zerod's alone: refused (INVALID_ARGUMENT naming
// the flag) when another user owns it or its mode lets a group or others read or write it. A
// symbolic link is followed (a Kubernetes Secret's files are links); its target is what counts.
// A file in systemd's $CREDENTIALS_DIRECTORY (LoadCredential=) may be root's and readable by its
// group (systemd gives it to the service alone through an ACL, whose mask the group bits show),
// never by others, and only while that directory is root's and writable by root alone: the
// variable set outside systemd buys nothing.
absl::StatusOr<std::string> ReadPrivateKeyFile(const std::string& path, absl::string_view flag);

// The subject's common name (CN) of the first certificate in `pem`; empty when there is none or
// it cannot be parsed.
std::string CertificateCommonName(absl::string_view pem);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_PEM_FILE_H_
