#include "tests/util/etcd_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/util/certificates.h"
#include "tests/util/test_time.h"

namespace zerod::testing {
namespace {

// A loopback port nobody listens on now (the kernel's pick for port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  close(fd);
  return ntohs(address.sin_port);
}

// deploy/etcd/auth.sh, as an operator runs it.
std::string AuthScript() { return ZEROD_SOURCE_DIR "/deploy/etcd/auth.sh"; }

}  // namespace

bool EtcdCluster::Installed(bool with_etcdctl) {
  return access(kBinary, X_OK) == 0 && (!with_etcdctl || access(kEtcdctl, X_OK) == 0);
}

std::string EtcdCluster::member_ca_file() const {
  return dir() + (security_.rogue_member_ca ? "/rogue-ca.pem" : "/etcd-ca.pem");
}

std::string EtcdCluster::MakeCertificates() {
  const std::string member_ca = security_.rogue_member_ca ? "rogue-ca" : "etcd-ca";
  for (const std::string& error :
       {MakeCa(dir(), "etcd-ca"), security_.rogue_member_ca ? MakeCa(dir(), "rogue-ca") : "",
        IssueCertificate(dir(), member_ca, "etcd-member", "etcd", security_.member_sans),
        IssueCertificate(dir(), "etcd-ca", "root", "root"),
        IssueCertificate(dir(), "etcd-ca", "zerod", "zerod")}) {
    if (!error.empty()) return error;
  }
  return "";
}

std::vector<std::string> EtcdCluster::ZerodFlags() const {
  if (!security_.tls) return {};
  return {"--etcd-ca",          ca_file(),    "--etcd-cert",
          dir() + "/zerod.pem", "--etcd-key", dir() + "/zerod.key"};
}

ProcessResult EtcdCluster::Etcdctl(const std::vector<std::string>& args) const {
  std::vector<std::string> command = {kEtcdctl};
  command.insert(command.end(), args.begin(), args.end());
  return AsRoot(command);
}

ProcessResult EtcdCluster::AsRoot(const std::vector<std::string>& command) const {
  std::vector<std::string> endpoints;
  for (const std::string& e : Endpoints()) {
    endpoints.push_back(absl::StrCat(security_.tls ? "https://" : "http://", e));
  }
  std::vector<std::string> argv = {"/usr/bin/env", "ETCDCTL_API=3",
                                   "ETCDCTL_ENDPOINTS=" + absl::StrJoin(endpoints, ",")};
  if (security_.tls) {
    argv.insert(argv.end(), {"ETCDCTL_CACERT=" + ca_file(), "ETCDCTL_CERT=" + dir() + "/root.pem",
                             "ETCDCTL_KEY=" + dir() + "/root.key"});
  }
  argv.insert(argv.end(), command.begin(), command.end());
  return RunProcess(argv);
}

std::shared_ptr<grpc::Channel> EtcdCluster::Channel(int member) const {
  if (!security_.tls) {
    return grpc::CreateChannel(Endpoint(member), grpc::InsecureChannelCredentials());
  }
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = read(member_ca_file());
  tls.pem_cert_chain = read(dir() + "/root.pem");
  tls.pem_private_key = read(dir() + "/root.key");
  // The members' certificate may name none of their addresses (member_sans): its first DNS name.
  grpc::ChannelArguments args;
  const size_t dns = security_.member_sans.find("DNS:");
  if (dns != std::string::npos) {
    const size_t end = security_.member_sans.find(',', dns);
    args.SetSslTargetNameOverride(security_.member_sans.substr(
        dns + 4, end == std::string::npos ? std::string::npos : end - dns - 4));
  }
  return grpc::CreateCustomChannel(Endpoint(member), grpc::SslCredentials(tls), args);
}

EtcdCluster::EtcdCluster(int members, EtcdSecurity security) : security_(std::move(security)) {
  if (security_.tls) {
    error_ = MakeCertificates();
    if (!error_.empty()) return;
  }
  std::random_device random;
  token_ = absl::StrCat("zerod-test-", random());
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = absl::StrCat("m", i);
    m.client_port = FreePort();
    m.peer_port = FreePort();
    m.data_dir = absl::StrCat(dir_.path(), "/", m.name);
    m.log_path = absl::StrCat(dir_.path(), "/", m.name, ".log");
    peers.push_back(absl::StrCat(m.name, "=", Url(m.peer_port)));
    members_.push_back(std::move(m));
  }
  initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) Start(i, "new");
  if (Leader() < 0) {
    error_ = absl::StrCat("etcd cluster of ", members, " elected no leader within ",
                          absl::FormatDuration(Scaled(absl::Seconds(30))), "; member 0: ", Log(0));
    return;
  }
  if (security_.auth) {
    const ProcessResult r = AsRoot({"/bin/sh", AuthScript(), security_.zerod_prefix});
    if (r.exit_code != 0) error_ = absl::StrCat("deploy/etcd/auth.sh: ", r.out, r.err);
  }
}

std::string EtcdCluster::Url(int port) const {
  return absl::StrCat(security_.tls ? "https" : "http", "://127.0.0.1:", port);
}

EtcdCluster::~EtcdCluster() = default;

void EtcdCluster::Start(int member, const std::string& state) {
  Member& m = members_[member];
  const std::string client = Url(m.client_port);
  std::vector<std::string> env;
  // etcd refuses to start on architectures it does not test on unless told.
  utsname machine{};
  uname(&machine);
  if (std::string(machine.machine) != "x86_64") {
    env.push_back(absl::StrCat("ETCD_UNSUPPORTED_ARCH=", machine.machine == std::string("aarch64")
                                                             ? "arm64"
                                                             : machine.machine));
  }
  std::vector<std::string> argv = {
      kBinary, "--name", m.name, "--data-dir", m.data_dir, "--listen-client-urls", client,
      "--advertise-client-urls", client, "--listen-peer-urls", Url(m.peer_port),
      "--initial-advertise-peer-urls", Url(m.peer_port), "--initial-cluster", initial_cluster_,
      "--initial-cluster-state", state, "--initial-cluster-token", token_,
      // A lost leader is replaced within about a second (on an idle machine).
      "--heartbeat-interval", ScaledMs(absl::Milliseconds(50)), "--election-timeout",
      ScaledMs(absl::Milliseconds(500)), "--log-level", "error", "--logger", "zap"};
  if (security_.tls) {
    // As docs/operators.md runs it: one member certificate for clients and peers, both of which
    // must present a certificate of etcd's CA (clients unless told otherwise, for a test of an
    // etcd that lets anyone in).
    const std::string cert = dir() + "/etcd-member.pem", key = dir() + "/etcd-member.key";
    argv.insert(argv.end(), {"--cert-file", cert, "--key-file", key, "--peer-cert-file", cert,
                             "--peer-key-file", key, "--peer-trusted-ca-file", member_ca_file(),
                             "--peer-client-cert-auth"});
    if (security_.client_certs) {
      argv.insert(argv.end(), {"--trusted-ca-file", ca_file(), "--client-cert-auth"});
    }
  }
  m.process = std::make_unique<ChildProcess>(argv, m.log_path, env);
}

std::vector<std::string> EtcdCluster::Endpoints() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < members_.size(); ++i) out.push_back(Endpoint(static_cast<int>(i)));
  return out;
}

std::string EtcdCluster::Endpoint(int member) const {
  return absl::StrCat("127.0.0.1:", members_[member].client_port);
}

int EtcdCluster::Leader(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  do {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!Running(static_cast<int>(i))) continue;
      auto stub = etcdserverpb::Maintenance::NewStub(Channel(static_cast<int>(i)));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Milliseconds(500))));
      etcdserverpb::StatusResponse status;
      if (!stub->Status(&context, etcdserverpb::StatusRequest(), &status).ok()) continue;
      // A member answers for itself: it leads when the leader's id is its own.
      if (status.leader() != 0 && status.leader() == status.header().member_id()) {
        return static_cast<int>(i);
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < deadline);
  return -1;
}

void EtcdCluster::Kill(int member) {
  Member& m = members_[member];
  if (m.process == nullptr) return;
  m.process->Signal(SIGKILL);
  m.process->Wait(absl::Seconds(30));
  m.process.reset();
}

void EtcdCluster::Restart(int member) {
  Kill(member);
  // Its data dir holds the membership: "existing" is ignored then, as is the initial cluster.
  Start(member, "existing");
}

bool EtcdCluster::Running(int member) {
  Member& m = members_[member];
  return m.process != nullptr && m.process->Wait(absl::ZeroDuration()) == -1;
}

std::string EtcdCluster::Log(int member) const {
  std::ifstream in(members_[member].log_path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace zerod::testing
