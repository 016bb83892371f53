#ifndef ZEROD_TESTS_UTIL_CERTIFICATES_H_
#define ZEROD_TESTS_UTIL_CERTIFICATES_H_

// Certificates for tests, made as an operator makes them: with deploy/etcd/certs.sh (the openssl
// CLI). Each returns "" when done, else what the script said.

#include <string>

namespace zerod::testing {

// A CA: DIR/NAME.pem and DIR/NAME.key.
std::string MakeCa(const std::string& dir, const std::string& name);
// DIR/NAME.pem and DIR/NAME.key (0600), signed by the CA DIR/CA.pem, for `common_name`, with the
// subjectAltName entries `sans` ("IP:127.0.0.1,DNS:localhost"; empty: none); usable by TLS servers
// and clients; valid for `days` days (the script's default when 0).
std::string IssueCertificate(const std::string& dir, const std::string& ca, const std::string& name,
                             const std::string& common_name, const std::string& sans = "",
                             int days = 0);
// An intermediate CA, DIR/NAME.pem and DIR/NAME.key, signed by the CA DIR/CA.pem (the openssl CLI
// as certs.sh uses it: certs.sh makes root CAs only).
std::string MakeIntermediateCa(const std::string& dir, const std::string& ca,
                               const std::string& name);

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_CERTIFICATES_H_
