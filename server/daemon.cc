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
#include "server/auth/cluster_members.h"
#include "server/auth/job_tokens.h"
#include "server/auth/token_digest.h"
#include "server/checkpoint_records.h"
#include "server/clock.h"
#include "server/coordinator_service.h"
#include "server/inspect_service.h"
#include "server/instance_lock.h"
#include "server/job_registry.h"
#include "server/logging.h"
#include "server/metrics/call_metrics.h"
#include "server/metrics/job_metrics.h"
#include "server/metrics/text_format.h"
#include "server/state/state_store.h"
#include "server/status/access_gate.h"
#include "server/status/history_sampler.h"
#include "server/status/status_routes.h"
#include "server/store_service.h"

namespace zerod::server {
namespace {

StoreLimits StoreLimitsOf(const DaemonOptions& options) {
  StoreLimits limits = options.store_limits;
  limits.max_value_bytes = options.max_value_bytes;
  return limits;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options,
                                                      std::unique_ptr<EtcdClaim> claim) {
  auto log = Logger("coordinator");
  if (options.socket_path.empty() && options.listen_address.empty()) {
    return absl::InvalidArgumentError("nothing to listen on: give --socket or --listen");
  }
  if (absl::Status s =
          auth::CheckTcpSecurity(options.listen_address, options.tls, options.allow_plaintext_tcp);
      !s.ok()) {
    return s;
  }
  gid_t socket_gid = static_cast<gid_t>(-1);
  if (!options.socket_group.empty()) {
    const group* g = getgrnam(options.socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket-group: no group named '", options.socket_group, "'"));
    }
    socket_gid = g->gr_gid;
  }
  gid_t viewer_gid = static_cast<gid_t>(-1);
  if (!options.viewer_group.empty()) {
    const group* g = getgrnam(options.viewer_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--viewer-group: no group named '", options.viewer_group, "'"));
    }
    viewer_gid = g->gr_gid;
  }
  std::unique_ptr<Daemon> d(new Daemon());
  d->options_ = options;
  // Claimed before the state is opened and held for the daemon's life (or by the caller, for
  // longer): one zerod per data dir and per socket path.
  if (options.claim_paths) {
    auto data_lock = ClaimDataDir(options.data_dir);
    if (!data_lock.ok()) return data_lock.status();
    d->data_lock_.emplace(*std::move(data_lock));
  }
  if (options.claim_paths && !options.socket_path.empty()) {
    auto socket_lock = ClaimSocketPath(options.socket_path);
    if (!socket_lock.ok()) return socket_lock.status();
    d->socket_lock_.emplace(*std::move(socket_lock));
  }
  StateStoreOptions state{.store = options.store,
                          .etcd_max_txn_ops = options.etcd_max_txn_ops,
                          .etcd_tls = options.etcd_tls,
                          .data_dir = options.data_dir,
                          .durability = options.durability,
                          .reset_state = options.reset_state};
  auto opened = OpenStateStore(state, std::move(claim));
  if (!opened.ok()) return opened.status();
  d->claim_ = std::move(opened->claim);
  d->kv_ = std::move(opened->kv);
  d->state_where_ = opened->where;
  const std::string& db = d->state_where_;
  d->clock_ = std::make_unique<RealClock>();
  d->registry_ =
      std::make_unique<JobRegistry>(d->kv_.get(), d->clock_.get(),
                                    RegistryOptions{options.lease_ttl, options.restart_grace,
                                                    options.join_limits, options.max_jobs});
  if (absl::Status s = d->registry_->Recover(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(db, ": ", s.message()));
  }
  if (absl::Status s = d->StartAuth(viewer_gid); !s.ok()) return s;
  d->checkpoints_ = std::make_unique<CheckpointRecords>(
      d->kv_.get(), d->clock_.get(),
      [registry = d->registry_.get()](const std::string& job_id) {
        return registry->JobExists(job_id) ? absl::OkStatus() : registry->Missing(job_id);
      },
      CheckpointLimits{options.join_limits.max_world_size, options.join_limits.max_job_id_bytes});
  const size_t recovered = d->registry_->ListJobs().size();
  log->info("state {} (revision {}): {} job(s) recovered", db, d->kv_->revision(), recovered);

  d->coordinator_ = std::make_unique<CoordinatorService>(
      d->registry_.get(), d->tokens_.get(), d->checkpoints_.get(), options.node_address);
  d->store_ = std::make_unique<StoreService>(d->kv_.get(), d->clock_.get(), d->registry_.get(),
                                             StoreLimitsOf(options), d->tokens_.get());
  d->inspect_ =
      std::make_unique<InspectService>(d->registry_.get(), d->checkpoints_.get(), d->tokens_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.socket_path.empty()) {
    builder.AddListeningPort("unix:" + options.socket_path, grpc::InsecureServerCredentials());
  }
  if (!options.listen_address.empty()) {
    builder.AddListeningPort(options.listen_address, auth::TcpCredentials(options.tls),
                             &d->tcp_port_);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(d->coordinator_.get());
  builder.RegisterService(d->store_.get());
  builder.RegisterService(d->inspect_.get());
  // Every call counted by method and code, for /metrics: only when something serves them (an
  // interceptor sends every call through gRPC's interception path, which costs on each call).
  if (!options.http_listen.empty()) {
    builder.experimental().SetInterceptorCreators(metrics::CallMetricsInterceptors());
  }
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
              !options.tls.enabled()            ? "plaintext"
              : !options.tls.client_ca.empty()  ? "TLS, client certificates required"
              : !options.tls.cluster_ca.empty() ? "TLS, cluster members known by their certificates"
                                                : "TLS");
  }
  d->probe_stub_ =
      std::make_unique<grpc::GenericStub>(d->server_->InProcessChannel(grpc::ChannelArguments()));
  if (options.test_stall_loop_after != absl::InfiniteDuration()) {
    log->warn("ZEROD_TEST_STALL_LOOP_AFTER (a fake for tests): the timer thread stalls in {}",
              absl::FormatDuration(options.test_stall_loop_after));
    d->registry_->RunOnTimerThread(
        d->clock_->Now() + options.test_stall_loop_after, [release = d->release_stall_] {
          Logger("coordinator")->warn("test stall: the timer thread is stuck");
          release->WaitForNotification();
        });
  }
  {
    MutexLock lock(&d->mu_);
    d->last_sweep_ = d->clock_->Now();
  }
  if (!options.http_listen.empty()) {
    if (absl::Status s = d->StartHttp(); !s.ok()) return s;
  }
  d->reaper_ = std::thread([raw = d.get()] { raw->ReaperLoop(); });
  return d;
}

absl::Status Daemon::StartAuth(gid_t viewer_gid) {
  auto log = Logger("coordinator");
  if (!options_.authenticate) {
    log->warn("authentication off (--no-auth): any client may act on any job");
    return absl::OkStatus();
  }
  const std::string admin_file = options_.admin_token_file.empty()
                                     ? options_.data_dir + "/admin.token"
                                     : options_.admin_token_file;
  auto admin = auth::LoadOrCreateAdminToken(admin_file);
  if (!admin.ok()) return admin.status();
  auth::ViewPolicy views{.open = options_.open_inspection};
  if (!options_.tls.cluster_ca.empty()) {
    auto members = auth::ClusterMembers::FromPem(options_.tls.cluster_ca, clock_.get());
    if (!members.ok()) return members.status();
    views.cluster_members = *std::move(members);
  }
  const std::string viewer_file = options_.viewer_token_file.empty()
                                      ? options_.data_dir + "/viewer.token"
                                      : options_.viewer_token_file;
  if (!options_.open_inspection) {
    auto viewer = auth::LoadOrCreateViewerToken(viewer_file, viewer_gid);
    if (!viewer.ok()) return viewer.status();
    views.viewer_token = *viewer;
  }
  const JobRegistry* registry = registry_.get();
  tokens_ = std::make_unique<auth::JobTokens>(
      kv_.get(), [registry](const std::string& job_id) { return registry->JobExists(job_id); },
      [registry](const std::string& job_id) { return registry->JobEnded(job_id); }, *admin, views);
  if (absl::Status s = tokens_->Recover(); !s.ok()) return s;
  log->info("authentication on: job tokens, admin token {}; read-only views over TCP: {}",
            admin_file,
            options_.open_inspection ? "open (--open-inspection)" : "viewer token " + viewer_file);
  return absl::OkStatus();
}

absl::Status Daemon::StartHttp() {
  job_metrics_ = std::make_unique<metrics::JobMetrics>(
      registry_.get(), metrics::JobMetricsOptions{options_.metrics_max_ranks_per_job});
  http_ = std::make_unique<http::HttpServer>();
  // Every request needs the viewer or admin token, as the read-only gRPC views over TCP do,
  // unless inspection is open (--open-inspection, or no authentication at all).
  if (tokens_ != nullptr && !tokens_->inspection_open()) {
    http_->SetGate(status::AccessGate([tokens = tokens_.get()](absl::string_view token) {
      return tokens->IsViewerOrAdmin(token);
    }));
  }
  http_->Route("/metrics", [jobs = job_metrics_.get()](const http::Request&) {
    return http::Response{200, metrics::kTextContentType, metrics::ScrapeAll(jobs, absl::Now())};
  });
  // The status page at / and its JSON under /api/ (server/status).
  history_sampler_ = std::make_unique<status::HistorySampler>(registry_.get());
  status::RegisterStatusRoutes(*http_, registry_.get(), checkpoints_.get(),
                               &history_sampler_->history());
  absl::Status started = http_->Start(options_.http_listen);
  // A malformed address is the flag's fault: named so that zerod exits with a usage error.
  if (started.code() == absl::StatusCode::kInvalidArgument) {
    return absl::InvalidArgumentError(absl::StrCat("--http-listen: ", started.message()));
  }
  return started;
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
    last_sweep_ = clock_->Now();
  }
}

void Daemon::Shutdown(absl::Duration grace) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  release_stall_->Notify();
  if (reaper_.joinable()) reaper_.join();
  // First: its handlers read the registry.
  if (http_) http_->Stop();
  if (history_sampler_) history_sampler_->Stop();
  if (!server_) return;
  auto log = Logger("coordinator");
  const absl::Time start = absl::Now();
  log->info("shutting down: answering waiting calls, draining in-flight ones (up to {})",
            absl::FormatDuration(grace));
  // First, so that probes and load balancers stop sending before anything is refused.
  server_->GetHealthCheckService()->Shutdown();
  // Connected ranks learn it from their Watch streams and waiting calls, which end UNAVAILABLE
  // ("shutting down; retry"): the SDK retries against the next daemon instead of failing.
  registry_->Shutdown();
  store_->Shutdown();
  probe_stub_.reset();  // the watchdog has stopped; its channel goes before the server
  server_->Shutdown(absl::ToChronoTime(start + grace));
  server_->Wait();
  server_.reset();
  log->info("calls drained in {}; flushing the state", absl::FormatDuration(absl::Now() - start));
  // Commits still queued run their callbacks against the registry: drain the store first.
  store_.reset();
  kv_.reset();
  claim_.reset();
  registry_.reset();
  log->info("state flushed and closed; drained in {}", absl::FormatDuration(absl::Now() - start));
}

absl::Status Daemon::ProbeLoops(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Posted before the health check, so both loops are probed in the same time. A probe that has
  // not run yet is waited for, not joined by another: a stuck thread would pile them up.
  if (timer_probe_ == nullptr || timer_probe_->HasBeenNotified()) {
    timer_probe_ = std::make_shared<absl::Notification>();
    registry_->RunOnTimerThread(clock_->Now(), [probe = timer_probe_] { probe->Notify(); });
  }
  // gRPC's own health service, through the server's completion queues and threads as a client's
  // call would go. Shared with the callback: a late answer lands after this returned.
  struct HealthCall {
    grpc::ClientContext context;
    grpc::ByteBuffer request, response;
    grpc::Status status;
    absl::Notification done;
  };
  auto call = std::make_shared<HealthCall>();
  grpc::Slice empty("");  // an empty HealthCheckRequest: the whole server
  call->request = grpc::ByteBuffer(&empty, 1);
  call->context.set_deadline(absl::ToChronoTime(deadline));
  probe_stub_->UnaryCall(&call->context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                         &call->request, &call->response, [call](grpc::Status status) {
                           call->status = std::move(status);
                           call->done.Notify();
                         });
  const std::string within = absl::FormatDuration(timeout);
  // gRPC ends the call at its deadline; the extra time is for gRPC's own threads being stuck.
  if (!call->done.WaitForNotificationWithDeadline(deadline + timeout)) {
    return absl::UnavailableError(
        absl::StrCat("a health check through the gRPC server did not finish within ", within));
  }
  if (!call->status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the gRPC server did not answer a health check within ", within, ": ",
                     call->status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  std::string answer;
  if (call->response.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      answer.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  if (answer != std::string("\x08\x01", 2)) {  // HealthCheckResponse{status: SERVING}
    return absl::UnavailableError("the gRPC server's health check does not answer SERVING");
  }
  if (!timer_probe_->WaitForNotificationWithDeadline(deadline)) {
    return absl::UnavailableError(
        absl::StrCat("the registry's timer thread (join deadlines) did not run a probe within ",
                     within, "; is a callback on it stuck?"));
  }
  const absl::Duration period = std::max(options_.lease_ttl / 4, absl::Milliseconds(10));
  MutexLock lock(&mu_);
  // A sweep may run a period late and still take its time over many jobs.
  if (const absl::Duration since = clock_->Now() - last_sweep_; since > 4 * period + timeout) {
    return absl::UnavailableError(absl::StrCat("the lease sweep last ran ",
                                               absl::FormatDuration(since),
                                               " ago; is it stuck on a job's lock?"));
  }
  return absl::OkStatus();
}

std::string Daemon::StatusLine() const {
  int64_t open = 0, ended = 0;
  for (const v1::JobSummary& job : registry_->ListJobs()) {
    ++(job.state() == v1::JOB_ENDED ? ended : open);
  }
  std::string line = absl::StrCat("serving: ", open, " job(s) open, ", ended, " ended; on");
  if (!options_.socket_path.empty()) absl::StrAppend(&line, " unix:", options_.socket_path);
  if (!options_.listen_address.empty()) {
    absl::StrAppend(&line, " ",
                    options_.listen_address.substr(0, options_.listen_address.rfind(':')), ":",
                    tcp_port_);
  }
  return line;
}

}  // namespace zerod::server
