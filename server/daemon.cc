#include "server/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/auth/job_tokens.h"
#include "server/auth/token_digest.h"
#include "server/checkpoint_records.h"
#include "server/clock.h"
#include "server/coordinator_service.h"
#include "server/inspect_service.h"
#include "server/instance_lock.h"
#include "server/job_registry.h"
#include "server/logging.h"
#include "server/state/state_dir.h"
#include "server/store_service.h"

namespace zerod::server {
namespace {

StoreLimits StoreLimitsOf(const DaemonOptions& options) {
  StoreLimits limits = options.store_limits;
  limits.max_value_bytes = options.max_value_bytes;
  return limits;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  auto log = Logger("coordinator");
  if (options.socket_path.empty() && options.listen_address.empty()) {
    return absl::InvalidArgumentError("nothing to listen on: give --socket or --listen");
  }
  if (absl::Status s =
          auth::CheckTcpSecurity(options.listen_address, options.tls, options.allow_plaintext_tcp);
      !s.ok()) {
    return s;
  }
  auto tcp_credentials = auth::TcpCredentials(options.tls);
  if (!tcp_credentials.ok()) return tcp_credentials.status();
  gid_t socket_gid = static_cast<gid_t>(-1);
  if (!options.socket_group.empty()) {
    const group* g = getgrnam(options.socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket-group: no group named '", options.socket_group, "'"));
    }
    socket_gid = g->gr_gid;
  }
  std::unique_ptr<Daemon> d(new Daemon());
  d->options_ = options;
  // Claimed before the state is opened and held for the daemon's life: one zerod per data dir and
  // per socket path.
  auto data_lock = ClaimDataDir(options.data_dir);
  if (!data_lock.ok()) return data_lock.status();
  d->data_lock_.emplace(*std::move(data_lock));
  if (!options.socket_path.empty()) {
    auto socket_lock = ClaimSocketPath(options.socket_path);
    if (!socket_lock.ok()) return socket_lock.status();
    d->socket_lock_.emplace(*std::move(socket_lock));
  }
  const std::string db = StateDatabasePath(options.data_dir);
  auto kv =
      OpenStateDir(options.data_dir, StateDirOptions{options.durability, options.reset_state});
  if (!kv.ok()) return kv.status();
  d->kv_ = *std::move(kv);
  d->clock_ = std::make_unique<RealClock>();
  d->registry_ =
      std::make_unique<JobRegistry>(d->kv_.get(), d->clock_.get(),
                                    RegistryOptions{options.lease_ttl, options.restart_grace,
                                                    options.join_limits, options.max_jobs});
  if (absl::Status s = d->registry_->Recover(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(db, ": ", s.message()));
  }
  if (options.authenticate) {
    const std::string admin_file = options.admin_token_file.empty()
                                       ? options.data_dir + "/admin.token"
                                       : options.admin_token_file;
    auto admin = auth::LoadOrCreateAdminToken(admin_file);
    if (!admin.ok()) return admin.status();
    const JobRegistry* registry = d->registry_.get();
    d->tokens_ = std::make_unique<auth::JobTokens>(
        d->kv_.get(), [registry](const std::string& job_id) { return registry->JobExists(job_id); },
        [registry](const std::string& job_id) { return registry->JobEnded(job_id); }, *admin);
    if (absl::Status s = d->tokens_->Recover(); !s.ok()) return s;
    log->info("authentication on: job tokens, admin token {}", admin_file);
  } else {
    log->warn("authentication off (--no-auth): any client may act on any job");
  }
  d->checkpoints_ = std::make_unique<CheckpointRecords>(
      d->kv_.get(), d->clock_.get(),
      [registry = d->registry_.get()](const std::string& job_id) {
        return registry->JobExists(job_id) ? absl::OkStatus() : registry->Missing(job_id);
      },
      CheckpointLimits{options.join_limits.max_world_size, options.join_limits.max_job_id_bytes});
  const size_t recovered = d->registry_->ListJobs().size();
  log->info("state {} (revision {}): {} job(s) recovered", db, d->kv_->revision(), recovered);

  d->coordinator_ = std::make_unique<CoordinatorService>(d->registry_.get(), d->tokens_.get(),
                                                         d->checkpoints_.get());
  d->store_ = std::make_unique<StoreService>(d->kv_.get(), d->clock_.get(), d->registry_.get(),
                                             StoreLimitsOf(options), d->tokens_.get());
  d->inspect_ = std::make_unique<InspectService>(d->registry_.get(), d->checkpoints_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.socket_path.empty()) {
    builder.AddListeningPort("unix:" + options.socket_path, grpc::InsecureServerCredentials());
  }
  if (!options.listen_address.empty()) {
    builder.AddListeningPort(options.listen_address, *tcp_credentials, &d->tcp_port_);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(d->coordinator_.get());
  builder.RegisterService(d->store_.get());
  builder.RegisterService(d->inspect_.get());
  // The socket is made owner-only and opened to its group afterwards, so no one outside the
  // group can connect in between.
  const mode_t umask_before = umask(0177);
  d->server_ = builder.BuildAndStart();
  umask(umask_before);
  if (!d->server_ || (!options.listen_address.empty() && d->tcp_port_ == 0)) {
    d->server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ",
        options.socket_path.empty() ? "" : absl::StrCat("unix:", options.socket_path, " "),
        options.listen_address, " (address in use or not permitted?)"));
  }
  if (!options.socket_path.empty()) {
    if (chown(options.socket_path.c_str(), static_cast<uid_t>(-1), socket_gid) != 0 ||
        chmod(options.socket_path.c_str(), static_cast<mode_t>(options.socket_mode)) != 0) {
      d->server_->Shutdown();
      d->server_.reset();
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot set the mode or group of ", options.socket_path, ": ", std::strerror(errno)));
    }
    log->info("listening on unix:{} (mode {:04o}{}{})", options.socket_path, options.socket_mode,
              options.socket_group.empty() ? "" : ", group ", options.socket_group);
  }
  if (!options.listen_address.empty()) {
    const std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
    log->info("listening on {}:{} ({})", host, d->tcp_port_,
              options.tls.enabled()
                  ? (options.tls.client_ca.empty() ? "TLS" : "TLS, client certificates required")
                  : "plaintext");
  }
  d->reaper_ = std::thread([raw = d.get()] { raw->ReaperLoop(); });
  return d;
}

Daemon::~Daemon() { Shutdown(absl::Seconds(5)); }

void Daemon::ReaperLoop() {
  const absl::Duration period = std::max(options_.lease_ttl / 4, absl::Milliseconds(10));
  absl::Time last = clock_->Now();
  MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }, period);
    if (stopping_) break;
    mu_.Unlock();
    // A sweep more than a period late means this process was not running (SIGSTOP, a paused VM,
    // a starved machine): the heartbeats of that gap could not be heard, so they are not held
    // against the ranks.
    const absl::Time now = clock_->Now();
    const absl::Duration late = now - last - period;
    last = now;
    if (late > period) {
      Logger("coordinator")
          ->warn(
              "the lease sweep ran {} late (was the daemon stopped or starved?); leases are "
              "extended by that much",
              absl::FormatDuration(late));
    }
    registry_->ExpireLeases(late > period ? late : absl::ZeroDuration());
    mu_.Lock();
  }
}

void Daemon::Shutdown(absl::Duration grace) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  if (!server_) return;
  Logger("coordinator")->info("shutting down: answering waiting calls, draining in-flight ones");
  registry_->Shutdown();
  store_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  server_.reset();
  // Commits still queued run their callbacks against the registry: drain the store first.
  store_.reset();
  kv_.reset();
  registry_.reset();
}

}  // namespace zerod::server
