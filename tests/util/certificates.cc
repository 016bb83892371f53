#include "tests/util/certificates.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {
namespace {

std::string Certs(const std::vector<std::string>& args, int days = 0) {
  std::vector<std::string> argv = {"/usr/bin/env", absl::StrCat("DAYS=", days > 0 ? days : 825),
                                   "/bin/sh", ZEROD_SOURCE_DIR "/deploy/etcd/certs.sh"};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = RunProcess(argv);
  if (r.exit_code == 0) return "";
  return absl::StrCat("deploy/etcd/certs.sh ", absl::StrJoin(args, " "), ": exit ", r.exit_code,
                      ": ", r.out, r.err);
}

}  // namespace

std::string MakeCa(const std::string& dir, const std::string& name) {
  return Certs({"ca", dir, name});
}

std::string IssueCertificate(const std::string& dir, const std::string& ca, const std::string& name,
                             const std::string& common_name, const std::string& sans, int days) {
  std::vector<std::string> args = {"issue", dir, ca, name, common_name};
  if (!sans.empty()) args.push_back(sans);
  return Certs(args, days);
}

std::string MakeIntermediateCa(const std::string& dir, const std::string& ca,
                               const std::string& name) {
  const std::string script = R"(set -eu
cd "$1"
umask 077
printf 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n' >"$3.ext"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$3.key" \
  -out "$3.csr" -subj "/CN=$3" 2>/dev/null
openssl x509 -req -in "$3.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 825 \
  -extfile "$3.ext" -out "$3.pem" 2>/dev/null
rm -f "$3.csr" "$3.ext"
chmod 0644 "$3.pem")";
  const ProcessResult r = RunProcess({"/bin/sh", "-c", script, "sh", dir, ca, name});
  if (r.exit_code == 0) return "";
  return absl::StrCat("intermediate CA ", name, ": exit ", r.exit_code, ": ", r.out, r.err);
}

}  // namespace zerod::testing
