#include "tests/util/certificates.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {
namespace {

std::string Certs(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/bin/sh", ZEROD_SOURCE_DIR "/deploy/etcd/certs.sh"};
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
                             const std::string& common_name, const std::string& sans) {
  std::vector<std::string> args = {"issue", dir, ca, name, common_name};
  if (!sans.empty()) args.push_back(sans);
  return Certs(args);
}

}  // namespace zerod::testing
