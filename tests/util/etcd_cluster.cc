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

std::string PeerUrl(int port) { return absl::StrCat("http://127.0.0.1:", port); }

}  // namespace

bool EtcdCluster::Installed() { return access(kBinary, X_OK) == 0; }

EtcdCluster::EtcdCluster(int members) {
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
    peers.push_back(absl::StrCat(m.name, "=", PeerUrl(m.peer_port)));
    members_.push_back(std::move(m));
  }
  initial_cluster_ = absl::StrJoin(peers, ",");
  for (int i = 0; i < members; ++i) Start(i, "new");
  if (Leader() < 0) {
    error_ = absl::StrCat("etcd cluster of ", members,
                          " elected no leader within 30 s; member 0: ", Log(0));
  }
}

EtcdCluster::~EtcdCluster() = default;

void EtcdCluster::Start(int member, const std::string& state) {
  Member& m = members_[member];
  const std::string client = absl::StrCat("http://127.0.0.1:", m.client_port);
  std::vector<std::string> env;
  // etcd refuses to start on architectures it does not test on unless told.
  utsname machine{};
  uname(&machine);
  if (std::string(machine.machine) != "x86_64") {
    env.push_back(absl::StrCat("ETCD_UNSUPPORTED_ARCH=", machine.machine == std::string("aarch64")
                                                             ? "arm64"
                                                             : machine.machine));
  }
  m.process = std::make_unique<ChildProcess>(
      std::vector<std::string>{
          kBinary, "--name", m.name, "--data-dir", m.data_dir, "--listen-client-urls", client,
          "--advertise-client-urls", client, "--listen-peer-urls", PeerUrl(m.peer_port),
          "--initial-advertise-peer-urls", PeerUrl(m.peer_port), "--initial-cluster",
          initial_cluster_, "--initial-cluster-state", state, "--initial-cluster-token", token_,
          // A lost leader is replaced within about a second.
          "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "error",
          "--logger", "zap"},
      m.log_path, env);
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
  const absl::Time deadline = absl::Now() + timeout;
  do {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!Running(static_cast<int>(i))) continue;
      auto stub = etcdserverpb::Maintenance::NewStub(
          grpc::CreateChannel(Endpoint(static_cast<int>(i)), grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
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
