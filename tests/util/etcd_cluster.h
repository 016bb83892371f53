#ifndef ZEROD_TESTS_UTIL_ETCD_CLUSTER_H_
#define ZEROD_TESTS_UTIL_ETCD_CLUSTER_H_

// A real etcd cluster for tests: N members of /usr/bin/etcd (Debian's etcd-server, installed by
// scripts/setup.sh) on free loopback ports, each with its own data dir under a temp dir, with
// short heartbeat and election timeouts (scaled, tests/util/test_time.h) so that a lost leader is
// replaced within a second or so on an idle machine, and a busy one does not depose a live leader.
//
// Secured as docs/operators.md says, when asked: TLS on the client and peer ports with client
// certificates required (certificates from deploy/etcd/certs.sh), and etcd's authentication on
// with the users and role deploy/etcd/auth.sh makes (etcdctl, Debian's etcd-client). The
// certificates are under dir(): etcd-ca.pem, root.pem/.key (etcd's root user), zerod.pem/.key
// (zerod's user).

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {

struct EtcdSecurity {
  bool tls = false;          // TLS on the client and peer ports
  bool client_certs = true;  // with tls: client and peer certificates required
  bool auth = false;  // authentication on (needs tls): zerod's user may use zerod_prefix only
  std::string zerod_prefix = "/zerod/";
  // With tls, for tests of what zerod believes: the subject alternative names of the members'
  // certificate, and whether a CA other than the one zerod is given (etcd-ca.pem) signs it
  // (member_ca_file(); auth needs the default).
  std::string member_sans = "IP:127.0.0.1,DNS:localhost";
  bool rogue_member_ca = false;
};

class EtcdCluster {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kEtcdctl = "/usr/bin/etcdctl";
  // Whether etcd is installed (and etcdctl, which `auth` needs); tests GTEST_SKIP naming
  // scripts/setup.sh when it is not.
  static bool Installed(bool with_etcdctl = false);

  // Starts `members` members and waits until they have a leader; error() says why not.
  explicit EtcdCluster(int members, EtcdSecurity security = {});
  ~EtcdCluster();  // kills every member
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Empty when the cluster started and elected a leader.
  const std::string& error() const { return error_; }
  // Every member's client address, "127.0.0.1:port".
  std::vector<std::string> Endpoints() const;
  std::string Endpoint(int member) const;
  // The index of the member that leads, once one does within Scaled(`timeout`); -1 otherwise.
  int Leader(absl::Duration timeout = absl::Seconds(30));
  void Kill(int member);     // SIGKILL, no goodbye
  void Restart(int member);  // the same name, ports and data dir
  bool Running(int member);
  // The member's log (etcd writes errors only).
  std::string Log(int member) const;

  // Where the certificates are (a directory only its owner may enter).
  const std::string& dir() const { return dir_.path(); }
  std::string ca_file() const { return dir() + "/etcd-ca.pem"; }
  // The CA of the members' certificate: ca_file(), or another with rogue_member_ca.
  std::string member_ca_file() const;
  // The prefix zerod's etcd user may use (with `auth`).
  const std::string& zerod_prefix() const { return security_.zerod_prefix; }
  // zerod's flags for this etcd: --etcd-ca, --etcd-cert and --etcd-key with zerod's user's
  // certificate (none without TLS).
  std::vector<std::string> ZerodFlags() const;
  // etcdctl with `args` as etcd's root user, its output and exit code.
  ProcessResult Etcdctl(const std::vector<std::string>& args) const;
  // `command` with etcdctl's environment for etcd's root user (ETCDCTL_ENDPOINTS, _CACERT, ...).
  ProcessResult AsRoot(const std::vector<std::string>& command) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log_path;
    std::unique_ptr<ChildProcess> process;
  };
  void Start(int member, const std::string& state);
  // deploy/etcd/certs.sh's CA, one certificate for every member, root's and zerod's.
  std::string MakeCertificates();
  // http(s)://127.0.0.1:port, as the cluster speaks.
  std::string Url(int port) const;
  // A channel to `member` (TLS as root when the cluster speaks it).
  std::shared_ptr<grpc::Channel> Channel(int member) const;

  const EtcdSecurity security_;
  TempDir dir_;
  std::string initial_cluster_;
  std::string token_;
  std::vector<Member> members_;
  std::string error_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_ETCD_CLUSTER_H_
