#include "server/cluster/forwarding_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/auth_metadata.h"
#include "runtime/common/mutex.h"
#include "server/logging.h"

namespace zerod::server::cluster {
namespace {

class ForwardedCall;

// What the server and its calls share. A call reaches it until its last reaction, which may run on
// a gRPC thread after the server's owner has gone: hence shared, and outliving both.
struct CallTracker {
  Mutex mu;
  // Set by Shutdown: new calls are refused, and the ones in flight are cancelled.
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<ForwardedCall*> calls ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> forwarded{0};
};

// Header keys gRPC or HTTP/2 own: the leader call gets its own.
bool IsTransportKey(absl::string_view key) {
  return absl::StartsWith(key, ":") || absl::StartsWith(key, "grpc-") || key == "user-agent" ||
         key == "te" || key == "content-type";
}

// Keys only this follower may say (proto/auth_metadata.h), and any it adds itself: a caller's own
// values for them are dropped, so no caller can pass for a cluster member.
bool IsMemberKey(absl::string_view key,
                 const std::vector<std::pair<std::string, std::string>>& added_metadata) {
  if (key == rpc::kForwardedViaMetadata || key == rpc::kNodeAddressMetadata) return true;
  for (const auto& added : added_metadata) {
    if (added.first == key) return true;
  }
  return false;
}

absl::string_view View(const grpc::string_ref& s) { return absl::string_view(s.data(), s.size()); }

// One caller's call and its twin to the leader. The two reactors relay each other's messages, one
// in flight per direction: a message read from one side is written to the other, and the next is
// read only once that write is done. Deletes itself after both reactors' OnDone.
class ForwardedCall {
 public:
  ForwardedCall(std::shared_ptr<CallTracker> tracker, grpc::GenericCallbackServerContext* ctx,
                std::string leader_endpoint)
      : tracker_(std::move(tracker)),
        server_ctx_(ctx),
        leader_endpoint_(std::move(leader_endpoint)),
        server_side_(this),
        client_side_(this) {}

  grpc::ServerGenericBidiReactor* server_reactor() { return &server_side_; }

  // Starts the leader call (or refuses the caller when the server is stopping).
  void Start(grpc::GenericStub* stub,
             const std::vector<std::pair<std::string, std::string>>& added_metadata) {
    bool refused;
    {
      MutexLock lock(&tracker_->mu);
      refused = tracker_->shutting_down;
      tracker_->calls.insert(this);
    }
    MutexLock lock(&mu_);
    if (refused) {
      // No leader call: the caller's side alone is to finish.
      server_side_.Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("zerod forwarder to the leader at ",
                                                    leader_endpoint_, " is shutting down")));
      return;
    }
    tracker_->forwarded.fetch_add(1, std::memory_order_relaxed);
    // The caller's deadline and cancellation carry over to the leader call through gRPC's
    // propagation; OnCancel cancels it explicitly as well.
    client_ctx_ = grpc::ClientContext::FromCallbackServerContext(*server_ctx_);
    for (const auto& [key, value] : server_ctx_->client_metadata()) {
      if (IsTransportKey(View(key)) || IsMemberKey(View(key), added_metadata)) continue;
      client_ctx_->AddMetadata(std::string(View(key)), std::string(View(value)));
    }
    for (const auto& [key, value] : added_metadata) client_ctx_->AddMetadata(key, value);
    stub->PrepareBidiStreamingCall(client_ctx_.get(), server_ctx_->method(), grpc::StubOptions(),
                                   &client_side_);
    // Held while the caller's side may still start writes on the leader call (the caller's
    // reactions are not the leader call's, so without a hold it could end and be freed first).
    client_side_.AddHold();
    client_side_.StartRead(&down_);
    client_side_.StartCall();
    server_side_.StartRead(&up_);
  }

  // Shutdown: ends the call, UNAVAILABLE to the caller.
  void CancelForShutdown() {
    MutexLock lock(&mu_);
    cancelled_by_shutdown_ = true;
    if (client_ctx_ != nullptr) client_ctx_->TryCancel();
  }

 private:
  class ServerSide : public grpc::ServerGenericBidiReactor {
   public:
    explicit ServerSide(ForwardedCall* call) : call_(call) {}
    void OnReadDone(bool ok) override { call_->OnCallerRead(ok); }
    void OnWriteDone(bool ok) override { call_->OnCallerWritten(ok); }
    void OnCancel() override { call_->OnCallerCancelled(); }
    void OnDone() override { call_->OnServerSideDone(); }

   private:
    ForwardedCall* const call_;
  };

  class ClientSide : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit ClientSide(ForwardedCall* call) : call_(call) {}
    void OnReadDone(bool ok) override { call_->OnLeaderRead(ok); }
    void OnWriteDone(bool ok) override { call_->OnLeaderWritten(ok); }
    void OnDone(const grpc::Status& status) override { call_->OnClientSideDone(status); }

   private:
    ForwardedCall* const call_;
  };

  // Caller → leader.
  void OnCallerRead(bool ok) {
    MutexLock lock(&mu_);
    if (upstream_released_) return;  // the leader has ended the call: nothing more goes to it
    if (!ok) {
      // The caller half-closed (or is gone): so does the leader call.
      client_side_.StartWritesDone();
      ReleaseUpstream();
      return;
    }
    leader_write_pending_ = true;
    client_side_.StartWrite(&up_);
  }

  void OnLeaderWritten(bool ok) {
    MutexLock lock(&mu_);
    leader_write_pending_ = false;
    if (!ok || leader_finished_sending_) {
      ReleaseUpstream();
      return;
    }
    server_side_.StartRead(&up_);
  }

  // Leader → caller.
  void OnLeaderRead(bool ok) {
    MutexLock lock(&mu_);
    if (!ok) {
      // The leader's stream has ended; its status follows in OnClientSideDone, which waits for the
      // hold: release it unless a write to the leader is still out (its completion will).
      leader_finished_sending_ = true;
      if (!leader_write_pending_) ReleaseUpstream();
      return;
    }
    // The next read of the leader call starts from the caller's reaction, outside the leader
    // call's own: held until then, or the leader call could end (and be freed) in between.
    client_side_.AddHold();
    server_side_.StartWrite(&down_);
  }

  void OnCallerWritten(bool ok) {
    MutexLock lock(&mu_);
    if (ok) {
      client_side_.StartRead(&down_);
    } else {
      // The caller is gone; its pending read fails too, which releases the upstream hold.
      client_ctx_->TryCancel();
    }
    client_side_.RemoveHold();
  }

  void OnCallerCancelled() {
    MutexLock lock(&mu_);
    if (client_ctx_ != nullptr) client_ctx_->TryCancel();
  }

  void OnClientSideDone(const grpc::Status& status) {
    MutexLock lock(&mu_);
    leader_status_ = status;
    // No response is on its way to the caller: each holds the leader call open until written.
    FinishCaller();
  }

  // The caller's side is finished only once the leader call is done (FinishCaller runs from
  // OnClientSideDone, or in Start when there is no leader call), so this reaction is the call's
  // last.
  void OnServerSideDone() {
    {
      // Waits out the reaction that called Finish, which may still hold the lock.
      MutexLock lock(&mu_);
    }
    {
      MutexLock lock(&tracker_->mu);
      tracker_->calls.erase(this);
    }
    delete this;
  }

  void ReleaseUpstream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (upstream_released_) return;
    upstream_released_ = true;
    client_side_.RemoveHold();
  }

  void FinishCaller() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [key, value] : client_ctx_->GetServerTrailingMetadata()) {
      if (IsTransportKey(View(key))) continue;
      server_ctx_->AddTrailingMetadata(std::string(View(key)), std::string(View(value)));
    }
    grpc::Status status = leader_status_;
    if (cancelled_by_shutdown_) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("zerod forwarder to the leader at ", leader_endpoint_,
                                         " is shutting down; call again"));
    } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // Said by the channel when the leader cannot be reached; name it, so the caller's log says
      // which daemon is down.
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("leader zerod at ", leader_endpoint_,
                                         " unavailable: ", status.error_message()),
                            status.error_details());
    }
    server_side_.Finish(status);
  }

  const std::shared_ptr<CallTracker> tracker_;
  grpc::GenericCallbackServerContext* const server_ctx_;
  const std::string leader_endpoint_;
  ServerSide server_side_;
  ClientSide client_side_;

  Mutex mu_;
  std::unique_ptr<grpc::ClientContext> client_ctx_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer up_ ABSL_GUARDED_BY(mu_);    // a request on its way to the leader
  grpc::ByteBuffer down_ ABSL_GUARDED_BY(mu_);  // a response on its way to the caller
  bool leader_write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool leader_finished_sending_ ABSL_GUARDED_BY(mu_) = false;
  // The hold on the leader call is released: nothing from the caller goes to the leader anymore.
  bool upstream_released_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_by_shutdown_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status leader_status_ ABSL_GUARDED_BY(mu_);
};

class ForwardingService final : public grpc::CallbackGenericService {
 public:
  ForwardingService(std::shared_ptr<CallTracker> tracker, std::unique_ptr<grpc::GenericStub> stub,
                    std::string leader_endpoint,
                    std::vector<std::pair<std::string, std::string>> added_metadata)
      : tracker_(std::move(tracker)),
        stub_(std::move(stub)),
        leader_endpoint_(std::move(leader_endpoint)),
        added_metadata_(std::move(added_metadata)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    auto* call = new ForwardedCall(tracker_, ctx, leader_endpoint_);
    call->Start(stub_.get(), added_metadata_);
    return call->server_reactor();
  }

 private:
  const std::shared_ptr<CallTracker> tracker_;
  const std::unique_ptr<grpc::GenericStub> stub_;
  const std::string leader_endpoint_;
  const std::vector<std::pair<std::string, std::string>> added_metadata_;
};

}  // namespace

class ForwardingServer::Impl {
 public:
  std::shared_ptr<CallTracker> tracker = std::make_shared<CallTracker>();
  std::unique_ptr<ForwardingService> service;
  std::unique_ptr<grpc::Server> server;
  int tcp_port = 0;
  Mutex shutdown_mu;
  bool shut_down ABSL_GUARDED_BY(shutdown_mu) = false;
};

ForwardingServer::ForwardingServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<ForwardingServer>> ForwardingServer::Start(
    ForwardingOptions options) {
  if (options.socket_path.empty() && options.listen_address.empty()) {
    return absl::InvalidArgumentError(
        "forwarding server: neither a Unix socket nor a TCP address to serve");
  }
  if (options.leader_endpoint.empty()) {
    return absl::InvalidArgumentError("forwarding server: no leader endpoint (host:port)");
  }
  auto impl = std::make_unique<Impl>();

  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  channel_args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // A leader back after a restart is reached within a second or two, not after gRPC's default
  // backoff of up to two minutes; calls meanwhile fail fast (UNAVAILABLE) and the SDK retries.
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = grpc::CreateCustomChannel(
      options.leader_endpoint,
      options.leader_credentials ? options.leader_credentials : grpc::InsecureChannelCredentials(),
      channel_args);
  impl->service = std::make_unique<ForwardingService>(
      impl->tracker, std::make_unique<grpc::GenericStub>(channel), options.leader_endpoint,
      std::move(options.added_metadata));

  // Registered services take precedence over the generic one: health is answered here.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (!options.socket_path.empty()) {
    builder.AddListeningPort("unix:" + options.socket_path, grpc::InsecureServerCredentials());
  }
  if (!options.listen_address.empty()) {
    builder.AddListeningPort(
        options.listen_address,
        options.tcp_credentials ? options.tcp_credentials : grpc::InsecureServerCredentials(),
        &impl->tcp_port);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  for (grpc::Service* local : options.local_services) builder.RegisterService(local);
  builder.RegisterCallbackGenericService(impl->service.get());
  // As the daemon does: the socket is made owner-only and opened to its group afterwards, so no
  // one outside the group can connect in between.
  const mode_t umask_before = umask(0177);
  impl->server = builder.BuildAndStart();
  umask(umask_before);
  if (!impl->server || (!options.listen_address.empty() && impl->tcp_port == 0)) {
    impl->server.reset();
    return absl::UnavailableError(absl::StrCat(
        "forwarding server: cannot listen on ",
        options.socket_path.empty() ? "" : absl::StrCat("unix:", options.socket_path, " "),
        options.listen_address, " (address in use or not permitted?)"));
  }
  if (!options.socket_path.empty()) {
    if (chown(options.socket_path.c_str(), static_cast<uid_t>(-1), options.socket_gid) != 0 ||
        chmod(options.socket_path.c_str(), static_cast<mode_t>(options.socket_mode)) != 0) {
      const std::string why = std::strerror(errno);
      impl->server->Shutdown();
      impl->server.reset();
      return absl::PermissionDeniedError(absl::StrCat(
          "forwarding server: cannot set the mode or group of ", options.socket_path, ": ", why));
    }
  }
  impl->server->GetHealthCheckService()->SetServingStatus(true);
  Logger("cluster")->info(
      "forwarding {}{}{} to the leader at {}",
      options.socket_path.empty() ? "" : "unix:" + options.socket_path,
      options.socket_path.empty() || options.listen_address.empty() ? "" : " and ",
      options.listen_address.empty()
          ? ""
          : absl::StrCat(options.listen_address.substr(0, options.listen_address.rfind(':')), ":",
                         impl->tcp_port),
      options.leader_endpoint);
  return std::unique_ptr<ForwardingServer>(new ForwardingServer(std::move(impl)));
}

ForwardingServer::~ForwardingServer() { Shutdown(absl::ZeroDuration()); }

void ForwardingServer::Shutdown(absl::Duration grace) {
  MutexLock shutdown_lock(&impl_->shutdown_mu);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  CallTracker& tracker = *impl_->tracker;
  {
    MutexLock lock(&tracker.mu);
    tracker.shutting_down = true;  // calls arriving from now on are refused
    // Calls in flight get the grace to end by themselves; then the leader calls are cancelled and
    // each caller told UNAVAILABLE.
    tracker.mu.AwaitWithTimeout(
        [&tracker]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tracker.mu) { return tracker.calls.empty(); },
        grace);
    for (ForwardedCall* call : tracker.calls) call->CancelForShutdown();
  }
  // Lets the UNAVAILABLE statuses reach their callers, then cancels whatever is left (a caller
  // that neither reads nor half-closes).
  impl_->server->GetHealthCheckService()->Shutdown();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->server->Wait();
  // No reaction of ours runs after this: the service and stub may go.
  MutexLock lock(&tracker.mu);
  tracker.mu.Await([&tracker]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(tracker.mu) { return tracker.calls.empty(); });
}

int ForwardingServer::tcp_port() const { return impl_->tcp_port; }

int64_t ForwardingServer::forwarded_calls() const {
  return impl_->tracker->forwarded.load(std::memory_order_relaxed);
}

}  // namespace zerod::server::cluster
