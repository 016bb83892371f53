#include "server/cluster/member.h"

#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "proto/auth_metadata.h"
#include "server/auth/transport_security.h"
#include "server/logging.h"
#include "server/state/etcd_security.h"
#include "server/state/state_store.h"

namespace zerod::server::cluster {
namespace {

// How often a follower looks at its leader's claim: a new election starts within this of the
// claim's change (the claim itself lapses one lease TTL after its holder died).
constexpr absl::Duration kWatchInterval = absl::Milliseconds(250);
// How long a starting member waits for etcd to answer at all (then it exits 1, and its service
// manager starts it again).
constexpr absl::Duration kEtcdStartWait = absl::Seconds(30);

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// An endpoint's host ("[::1]" of "[::1]:7420"), and whether it is a wildcard that names no one
// address, which the two functions below each replace in their own way.
std::string HostOf(const std::string& endpoint) { return endpoint.substr(0, endpoint.rfind(':')); }
bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "[::0]";
}

// The address other members reach `listen`'s bound `port` at.
std::string Advertised(const std::string& listen, int port) {
  const std::string host = HostOf(listen);
  return absl::StrCat(IsWildcard(host) ? HostName() : host, ":", port);
}

// The host other nodes reach this node at, for its ranks' peer connections: `advertise`'s host,
// else `listen`'s, without an IPv6 literal's brackets. Empty for a wildcard: the host name is no
// safe guess (Debian maps it to 127.0.1.1), so such a node's ranks are told nothing and listen on
// ZEROD_GLOO_HOST or 127.0.0.1, unless --node-address says.
std::string NodeHost(const std::string& advertise, const std::string& listen) {
  std::string host = HostOf(advertise.empty() ? listen : advertise);
  if (IsWildcard(host)) return "";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Whether an etcd call may succeed when made again: no member answered yet (a cluster still
// starting, a member being replaced).
bool Transient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// The relay's channel to the leader, taking answers as large as the daemon's messages.
std::shared_ptr<grpc::Channel> LeaderChannel(
    const std::string& endpoint, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(endpoint, credentials, args);
}

// The members of a cluster prove to one another who they are with certificates of the cluster's
// CA (server/auth/cluster_members.h); INVALID_ARGUMENT naming the flag when they could not. Only
// with --no-auth, where no caller is authenticated anyway, may they speak plaintext.
absl::Status CheckMemberTls(const DaemonOptions& options) {
  const auth::TlsPem& tls = options.tls;
  if (options.authenticate && (!tls.enabled() || tls.cluster_ca.empty())) {
    return absl::InvalidArgumentError(
        "--cluster-ca: the members of an etcd cluster prove to one another who they are with "
        "TLS: give each member --tls-cert and --tls-key signed by the cluster's own CA, and that "
        "CA as --cluster-ca (docs/operators.md)");
  }
  if (tls.enabled() && tls.cluster_ca.empty()) {
    return absl::InvalidArgumentError(
        "--cluster-ca: a member checks its leader's certificate against the cluster's CA");
  }
  return absl::OkStatus();
}

// A socket file the previous role left: ours, since the member holds the path's lock.
void RemoveSocketFile(const std::string& path) {
  struct stat st {};
  if (!path.empty() && lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Member>> Member::Start(const DaemonOptions& options,
                                                      const ClusterOptions& cluster,
                                                      std::function<void()> role_changed) {
  ClusterOptions named = cluster;
  if (named.node.empty()) named.node = HostName();
  DaemonOptions daemon_options = options;
  if (options.store == "sqlite") {
    // One node: its ranks are told an address only when the operator gave one.
    if (daemon_options.node_address.empty() && !cluster.advertise.empty()) {
      daemon_options.node_address = NodeHost(cluster.advertise, "");
    }
    std::unique_ptr<Member> m(new Member(daemon_options, named, std::move(role_changed)));
    auto daemon = Daemon::Start(daemon_options);
    if (!daemon.ok()) return daemon.status();
    MutexLock lock(&m->mu_);
    m->daemon_ = *std::move(daemon);
    return m;
  }
  absl::StatusOr<EtcdOptions> etcd = EtcdOptionsOf(options.store, options.etcd_tls);
  if (!etcd.ok()) return etcd.status();
  if (options.listen_address.empty()) {
    return absl::InvalidArgumentError(
        "--listen: a zerod on etcd needs a TCP listener: the other members of its cluster forward "
        "their ranks' calls to the leader over it");
  }
  if (absl::Status s = CheckMemberTls(options); !s.ok()) return s;
  if (absl::Status s = CheckEtcdIsZerods(*etcd, kEtcdStartWait, options.allow_insecure_etcd);
      !s.ok()) {
    return s;
  }
  daemon_options.claim_paths = false;
  if (daemon_options.node_address.empty()) {
    daemon_options.node_address = NodeHost(cluster.advertise, options.listen_address);
  }
  if (!daemon_options.node_address.empty()) {
    Logger("cluster")->info("this node's ranks listen for their peers at {} (--node-address)",
                            daemon_options.node_address);
  }
  std::unique_ptr<Member> m(new Member(daemon_options, named, std::move(role_changed)));
  m->etcd_ = *etcd;
  auto data_lock = ClaimDataDir(options.data_dir);
  if (!data_lock.ok()) return data_lock.status();
  m->data_lock_.emplace(*std::move(data_lock));
  if (!options.socket_path.empty()) {
    auto socket_lock = ClaimSocketPath(options.socket_path);
    if (!socket_lock.ok()) return socket_lock.status();
    m->socket_lock_.emplace(*std::move(socket_lock));
  }
  if (absl::Status s = m->Elect(); !s.ok()) return s;
  return m;
}

Member::Member(DaemonOptions options, ClusterOptions cluster, std::function<void()> role_changed)
    : options_(std::move(options)),
      cluster_(std::move(cluster)),
      role_changed_(std::move(role_changed)) {}

Member::~Member() { StopRole(absl::ZeroDuration()); }

std::string Member::HolderValue(const std::string& endpoint) const {
  return nlohmann::json{{"node", cluster_.node}, {"endpoint", endpoint}, {"pid", getpid()}}.dump();
}

void Member::AskForElection() {
  if (!election_due_.exchange(true)) role_changed_();
}

absl::Status Member::Elect() {
  {
    MutexLock lock(&mu_);
    electing_ = true;
  }
  absl::Status elected = ElectUntilDone();
  MutexLock lock(&mu_);
  electing_ = false;
  return elected;
}

absl::Status Member::ElectUntilDone() {
  auto log = Logger("cluster");
  bool said_waiting = false;
  for (;;) {
    // A SIGTERM (or SIGINT) that came while electing: stop electing, so the process drains and
    // exits as it would have (the signals stay blocked for the main thread's sigwait).
    sigset_t pending;
    if (sigpending(&pending) == 0 &&
        (sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1)) {
      return absl::CancelledError("asked to stop while electing the cluster's leader");
    }
    absl::StatusOr<ClaimAttempt> attempt =
        EtcdClaim::TryAcquire(*etcd_, EtcdClaimOptions{options_.lease_ttl, HolderValue("")},
                              [this] { AskForElection(); });
    if (!attempt.ok() && !Transient(attempt.status())) return attempt.status();
    if (attempt.ok() && attempt->claim != nullptr) return Lead(std::move(attempt->claim));
    if (attempt.ok()) {
      // Whatever is in etcd is read without trusting its shape.
      const nlohmann::json holder = nlohmann::json::parse(attempt->holder, nullptr, false);
      const bool has_endpoint = holder.is_object() && holder.contains("endpoint") &&
                                holder["endpoint"].is_string() &&
                                !holder["endpoint"].get<std::string>().empty();
      if (has_endpoint) {
        const std::string node = holder.contains("node") && holder["node"].is_string()
                                     ? holder["node"].get<std::string>()
                                     : "?";
        return Follow(attempt->holder, holder["endpoint"].get<std::string>(), node);
      }
    }
    // etcd does not answer, or a leader still loading the state has not said where it listens:
    // wait (a leader that died before saying so loses its claim one lease TTL later).
    if (!said_waiting) {
      log->warn("waiting for the cluster's leader: {}",
                attempt.ok() ? "the claim's holder (" + attempt->holder.substr(0, 200) +
                                   ") has not announced its endpoint yet"
                             : std::string(attempt.status().message()));
      said_waiting = true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status Member::Lead(std::unique_ptr<EtcdClaim> claim) {
  RemoveSocketFile(options_.socket_path);
  auto daemon = Daemon::Start(options_, std::move(claim));
  if (!daemon.ok()) return daemon.status();
  const std::string endpoint = cluster_.advertise.empty()
                                   ? Advertised(options_.listen_address, (*daemon)->tcp_port())
                                   : cluster_.advertise;
  if (absl::Status s = (*daemon)->claim()->SetHolder(HolderValue(endpoint)); !s.ok()) return s;
  Logger("cluster")->info("node {} leads the cluster on {} (members forward to {})", cluster_.node,
                          etcd_->prefix, endpoint);
  MutexLock lock(&mu_);
  daemon_ = *std::move(daemon);
  leader_.clear();
  return absl::OkStatus();
}

absl::Status Member::Follow(const std::string& holder, const std::string& endpoint,
                            const std::string& node) {
  const std::string name = absl::StrCat(node, " at ", endpoint);
  gid_t socket_gid = static_cast<gid_t>(-1);
  if (!options_.socket_group.empty()) {
    const group* g = getgrnam(options_.socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket-group: no group named '", options_.socket_group, "'"));
    }
    socket_gid = g->gr_gid;
  }
  const std::shared_ptr<grpc::ServerCredentials> tcp_credentials =
      auth::TcpCredentials(options_.tls);
  // To the leader: this member's certificate, over TLS (plaintext only with --no-auth and no TLS).
  const std::shared_ptr<grpc::ChannelCredentials> leader_credentials =
      options_.tls.enabled() ? auth::MemberCredentials(options_.tls)
                             : grpc::InsecureChannelCredentials();
  // Heartbeats stay on the node: the relay answers them and tells the leader once per interval,
  // well inside the lease.
  const absl::Duration interval =
      std::clamp(options_.lease_ttl / 5, absl::Milliseconds(50), absl::Seconds(1));
  auto relay = std::make_shared<HeartbeatRelay>(LeaderChannel(endpoint, leader_credentials), name,
                                                cluster_.node, interval);
  std::vector<std::unique_ptr<grpc::Service>> relay_services;
  // One server per way in, so the leader learns which one a caller used.
  auto forward = [&](const std::string& socket, const std::string& listen,
                     const char* via) -> absl::StatusOr<std::unique_ptr<ForwardingServer>> {
    relay_services.push_back(relay->NewService());
    ForwardingOptions f;
    f.socket_path = socket;
    f.socket_mode = options_.socket_mode;
    f.socket_gid = socket_gid;
    f.listen_address = listen;
    f.tcp_credentials = tcp_credentials;
    f.leader_endpoint = endpoint;
    f.leader_credentials = leader_credentials;
    f.added_metadata = {{rpc::kForwardedViaMetadata, via},
                        {rpc::kNodeAddressMetadata, options_.node_address}};
    f.max_message_bytes = options_.max_message_bytes;
    f.local_services = {relay_services.back().get()};
    return ForwardingServer::Start(std::move(f));
  };
  RemoveSocketFile(options_.socket_path);
  std::shared_ptr<ForwardingServer> by_socket, by_tcp;
  if (!options_.socket_path.empty()) {
    auto started = forward(options_.socket_path, "", "unix");
    if (!started.ok()) return started.status();
    by_socket = *std::move(started);
  }
  auto started = forward("", options_.listen_address, "tcp");
  if (!started.ok()) return started.status();
  by_tcp = *std::move(started);
  auto watch = ClaimWatch::Start(*etcd_, holder, kWatchInterval, [this] { AskForElection(); });
  if (!watch.ok()) return watch.status();
  watch_ = *std::move(watch);
  Logger("cluster")->info("node {} follows the cluster's leader, {}", cluster_.node, name);
  MutexLock lock(&mu_);
  forwarder_ = std::move(by_tcp);
  socket_forwarder_ = std::move(by_socket);
  relay_ = std::move(relay);
  relay_services_ = std::move(relay_services);
  leader_ = name;
  return absl::OkStatus();
}

void Member::StopRole(absl::Duration grace) {
  watch_.reset();
  std::shared_ptr<Daemon> daemon;
  std::shared_ptr<ForwardingServer> forwarder, socket_forwarder;
  std::shared_ptr<HeartbeatRelay> relay;
  std::vector<std::unique_ptr<grpc::Service>> relay_services;
  {
    MutexLock lock(&mu_);
    daemon = std::move(daemon_);
    forwarder = std::move(forwarder_);
    socket_forwarder = std::move(socket_forwarder_);
    relay = std::move(relay_);
    relay_services = std::move(relay_services_);
  }
  if (daemon) daemon->Shutdown(grace);
  // The servers first (heartbeats still waiting are answered by the relay's next flush), then
  // their services, then the relay.
  if (socket_forwarder) socket_forwarder->Shutdown(grace);
  if (forwarder) forwarder->Shutdown(grace);
  socket_forwarder.reset();
  forwarder.reset();
  relay_services.clear();
  relay.reset();
}

absl::Status Member::Reelect() {
  if (!election_due_.exchange(false)) return absl::OkStatus();
  Logger("cluster")->info("the leader's claim changed: electing again");
  // Short: the ranks' calls fail UNAVAILABLE meanwhile and are retried by the SDK.
  StopRole(absl::Seconds(2));
  return Elect();
}

void Member::Shutdown(absl::Duration grace) { StopRole(grace); }

absl::Status Member::ProbeLoops(absl::Duration timeout) {
  std::shared_ptr<Daemon> daemon;
  {
    MutexLock lock(&mu_);
    daemon = daemon_;
    // Electing is the member's loop at work (it waits for etcd or a new leader), not stuck.
    if (!daemon) {
      return forwarder_ || electing_ ? absl::OkStatus() : absl::UnavailableError("between roles");
    }
  }
  return daemon->ProbeLoops(timeout);
}

std::string Member::StatusLine() const {
  MutexLock lock(&mu_);
  if (daemon_) return etcd_ ? daemon_->StatusLine() + "; leads the cluster" : daemon_->StatusLine();
  if (forwarder_) {
    const int64_t calls = forwarder_->forwarded_calls() +
                          (socket_forwarder_ ? socket_forwarder_->forwarded_calls() : 0);
    return absl::StrCat("follows the cluster's leader, ", leader_, "; ", calls,
                        " call(s) forwarded");
  }
  return "electing the cluster's leader";
}

int Member::tcp_port() const {
  MutexLock lock(&mu_);
  if (daemon_) return daemon_->tcp_port();
  return forwarder_ ? forwarder_->tcp_port() : 0;
}

int Member::http_port() const {
  MutexLock lock(&mu_);
  return daemon_ ? daemon_->http_port() : 0;
}

bool Member::leading() const {
  MutexLock lock(&mu_);
  return daemon_ != nullptr;
}

}  // namespace zerod::server::cluster
