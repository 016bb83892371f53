// coordinator_load: N simulated ranks over a few channels join one job, get the plan, heartbeat
// for S seconds, then leave (or, with --stay, exit without leaving). Beside the daemon's figures
// it measures the peer: a bare gRPC health check against the same daemon at the same concurrency,
// i.e. what gRPC itself costs on this machine. Every call carries the job's token (--token, else a
// new one). With --baseline-endpoint (a zerod started with --no-auth), the cost of authentication
// is measured in --rounds rounds, each a fresh job on each daemon, in the order A B, B A, A B, ...
// (A: --endpoint, B: the baseline), before the main load, and printed as the mean of the rounds'
// ratios with their range.
// The order alternates because whichever daemon runs second in a round is favoured (a warmer
// machine, caches, the client's own channels): with both daemons --no-auth, always measuring A
// first gave A x1.79 the join+plan time of B, which is no cost of anything.
//
// Heartbeats are a closed loop (one outstanding per rank, the most the daemon can take) unless
// --interval D: then each rank heartbeats every D whatever the answers, as trainers do (open
// loop; rank i's beats at i/N of the interval), and the rate asked, N/D, is printed beside the
// rate served.
//
//   build/bin/coordinator_load --endpoint E[,E2,...] --job J --ranks N --seconds S [--stay]
//       [--channels 8] [--daemon-pid P] [--peer-seconds 3] [--token T] [--interval D]
//       [--baseline-endpoint E2 [--rounds 4]]
//
// The last line is one JSON object.

#include <dirent.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"  // SetMutexDeadlockDetectionMode, for gRPC's mutexes
#include "absl/time/clock.h"
#include "proto/auth_metadata.h"
#include "proto/plan_convert.h"
#include "runtime/common/mutex.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"
#include "zerod/v1/coordinator.grpc.pb.h"

namespace {

using namespace zerod;

struct Flags {
  std::string endpoint, job = "load", token, baseline_endpoint;
  int64_t ranks = 1024, channels = 8, daemon_pid = 0, rounds = 4;
  double seconds = 5, peer_seconds = 3;
  double interval = 0;  // seconds between one rank's heartbeats; 0: closed loop
  bool stay = false;
};

// Counts completions and wakes the main thread when all are in.
class Countdown {
 public:
  explicit Countdown(int64_t n) : left_(n) {}
  void Done() {
    MutexLock lock(&mu_);
    --left_;
  }
  bool WaitFor(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return left_ <= 0; },
                                timeout);
  }

 private:
  Mutex mu_;
  int64_t left_ ABSL_GUARDED_BY(mu_);
};

// Latencies of a closed loop, in microseconds.
class Latencies {
 public:
  void Add(int64_t us) {
    MutexLock lock(&mu_);
    if (samples_.size() < (1u << 24)) samples_.push_back(us);
  }
  double PercentileMs(double p) {
    MutexLock lock(&mu_);
    if (samples_.empty()) return 0;
    const size_t k = std::min(samples_.size() - 1, static_cast<size_t>(p * samples_.size()));
    std::nth_element(samples_.begin(), samples_.begin() + static_cast<long>(k), samples_.end());
    return static_cast<double>(samples_[k]) / 1000.0;
  }

 private:
  Mutex mu_;
  std::vector<int64_t> samples_ ABSL_GUARDED_BY(mu_);
};

long RssKib(int64_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// The pid of the only process named "zerod", or 0.
int64_t FindDaemon() {
  int64_t found = 0;
  DIR* proc = opendir("/proc");
  if (!proc) return 0;
  while (dirent* e = readdir(proc)) {
    const int64_t pid = std::atoll(e->d_name);
    if (pid <= 0) continue;
    std::ifstream comm("/proc/" + std::string(e->d_name) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "zerod") found = found == 0 ? pid : -1;
  }
  closedir(proc);
  return found > 0 ? found : 0;
}

// `n` channels; with several endpoints ("E1,E2,E3": the members of a cluster, one per node),
// channel i goes to endpoint i mod their number, so the simulated ranks are spread over the nodes.
std::vector<std::shared_ptr<grpc::Channel>> MakeChannels(const std::string& endpoints, int64_t n) {
  const std::vector<std::string> each = absl::StrSplit(endpoints, ',');
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int64_t i = 0; i < n; ++i) {
    const std::string& endpoint = each[static_cast<size_t>(i) % each.size()];
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per channel
    args.SetInt("zerod.load.channel", static_cast<int>(i));
    args.SetMaxReceiveMessageSize(64 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args));
  }
  return channels;
}

// The mean, median and range of a few ratios (the median: a loaded machine gives outliers).
struct Spread {
  std::vector<double> values;
  void Add(double x) { values.push_back(x); }
  double Mean() const {
    double sum = 0;
    for (double v : values) sum += v;
    return values.empty() ? 0 : sum / static_cast<double>(values.size());
  }
  double Median() const {
    if (values.empty()) return 0;
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  double Min() const {
    return values.empty() ? 0 : *std::min_element(values.begin(), values.end());
  }
  double Max() const {
    return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
  }
  std::string Text() const {
    return absl::StrFormat("x%.3f (median %.3f, %.3f..%.3f)", Mean(), Median(), Min(), Max());
  }
};

// One job's load on one daemon: join and plan, closed-loop heartbeats, and (unless `stay`) leave.
struct LoadResult {
  bool ok = false;
  double join_plan_s = 0, hb_rate = 0, hb_p50 = 0, hb_p99 = 0, leave_s = 0;
  int64_t heartbeats = 0, heartbeat_errors = 0, leave_errors = 0;
  long rss_after_join = -1, rss_after_hb = -1;
};

LoadResult RunLoad(const Flags& f, const std::vector<std::unique_ptr<v1::Coordinator::Stub>>& stubs,
                   const std::string& token, int64_t pid, const std::string& label) {
  LoadResult result;
  // A small layout: the daemon's work per rank, not the plan's size, is what is measured.
  const std::vector<plan::TensorSpec> layout =
      plan::SyntheticLayout(1'000'000'000, DType::kBFloat16, 64);
  const std::string digest = plan::DigestHex(plan::LayoutDigest(layout));

  // Phase 1: join, and have the plan.
  struct Joins {
    Mutex mu;
    std::vector<int64_t> assigned ABSL_GUARDED_BY(mu);
    int64_t errors ABSL_GUARDED_BY(mu) = 0;
    int64_t generation ABSL_GUARDED_BY(mu) = 0;
    std::string first_error ABSL_GUARDED_BY(mu);
    std::optional<v1::PlanInputs> plan_inputs ABSL_GUARDED_BY(mu);
  } joins;
  {
    MutexLock lock(&joins.mu);
    joins.assigned.assign(static_cast<size_t>(f.ranks), -1);
  }
  Countdown joined(f.ranks);
  const absl::Time join_start = absl::Now();
  for (int64_t i = 0; i < f.ranks; ++i) {
    struct Call {
      grpc::ClientContext context;
      v1::JoinRequest request;
      v1::JoinResponse response;
    };
    auto* call = new Call;
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(300)));
    call->context.AddMetadata(rpc::kJobTokenMetadata, token);
    call->request.set_job_id(f.job);
    call->request.set_world_size(f.ranks);
    call->request.set_rank(-1);
    call->request.set_host("sim-" + std::to_string(i));
    call->request.set_device("sim");
    if (i == 0) rpc::ToProto(layout, call->request.mutable_layout());
    call->request.set_layout_digest(digest);
    call->request.mutable_options()->set_stage(3);
    stubs[static_cast<size_t>(i % f.channels)]->async()->Join(
        &call->context, &call->request, &call->response, [&, call, i](grpc::Status s) {
          {
            MutexLock lock(&joins.mu);
            if (s.ok()) {
              joins.assigned[static_cast<size_t>(i)] = call->response.rank();
              joins.generation = call->response.generation();
              if (!joins.plan_inputs) {
                joins.plan_inputs.emplace();
                joins.plan_inputs->ParseFromString(call->response.plan_inputs());
              }
            } else {
              ++joins.errors;
              if (joins.first_error.empty()) joins.first_error = s.error_message();
            }
          }
          delete call;
          joined.Done();
        });
  }
  joined.WaitFor(absl::Seconds(600));
  // Every simulated rank would recompute the plan and check the digest; they share one process,
  // so it is done once here and timed with the join.
  std::vector<int64_t> assigned;
  int64_t join_errors = 0, generation = 0;
  std::string first_error, plan_digest;
  {
    MutexLock lock(&joins.mu);
    assigned = joins.assigned;
    join_errors = joins.errors;
    generation = joins.generation;
    first_error = joins.first_error;
    auto plan = rpc::PlanFromInputs(joins.plan_inputs.value_or(v1::PlanInputs()));
    if (!plan.ok() && join_errors == 0) {
      std::fprintf(stderr, "coordinator_load: %s\n", std::string(plan.status().message()).c_str());
      return result;
    }
    if (plan.ok()) plan_digest = plan->DigestHex();
  }
  const double join_plan_s = absl::ToDoubleSeconds(absl::Now() - join_start);
  std::printf("%sjoin+plan: %ld ranks in %.3f s (%ld errors%s%s), plan %s\n", label.c_str(),
              static_cast<long>(f.ranks), join_plan_s, static_cast<long>(join_errors),
              first_error.empty() ? "" : ": ", first_error.c_str(), plan_digest.c_str());
  if (join_errors > 0) return result;
  const long rss_after_join = pid ? RssKib(pid) : -1;

  // Phase 2: heartbeats, closed-loop (one outstanding per rank) or every --interval.
  Latencies heartbeat_latency;
  std::atomic<int64_t> heartbeats{0}, heartbeat_errors{0};
  const absl::Time hb_end = absl::Now() + absl::Seconds(f.seconds);
  const bool open_loop = f.interval > 0;
  // Closed loop: each rank's chain ends once. Open loop: every beat issued ends once (counted as
  // they are issued, so the countdown starts at the largest number there can be).
  const absl::Duration interval = absl::Seconds(f.interval);
  const int64_t rounds = open_loop ? static_cast<int64_t>(f.seconds / f.interval) + 1 : 1;
  Countdown hb_done(f.ranks * rounds);
  struct Beat {
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    v1::HeartbeatResponse response;
    absl::Time start;
  };
  std::function<void(int64_t, int64_t)> beat = [&](int64_t i, int64_t step) {
    auto* b = new Beat;
    b->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    b->context.AddMetadata(rpc::kJobTokenMetadata, token);
    b->request.set_job_id(f.job);
    b->request.set_rank(assigned[static_cast<size_t>(i)]);
    b->request.set_generation(generation);
    b->request.set_step(step);
    auto& memory = *b->request.mutable_memory_bytes();
    for (const char* k : {"params", "grads", "master", "adam_m", "adam_v", "padding"})
      memory[k] = 1 << 20;
    (*b->request.mutable_comm_bytes())["all_gather"] = step << 20;
    b->start = absl::Now();
    stubs[static_cast<size_t>(i % f.channels)]->async()->Heartbeat(
        &b->context, &b->request, &b->response, [&, b, i, step](grpc::Status s) {
          const absl::Time now = absl::Now();
          heartbeat_latency.Add(absl::ToInt64Microseconds(now - b->start));
          if (s.ok()) {
            ++heartbeats;
          } else {
            ++heartbeat_errors;
          }
          delete b;
          if (!open_loop && now < hb_end) {
            beat(i, step + 1);
          } else {
            hb_done.Done();
          }
        });
  };
  const absl::Time hb_start = absl::Now();
  if (!open_loop) {
    for (int64_t i = 0; i < f.ranks; ++i) beat(i, 1);
  } else {
    int64_t issued = 0;
    for (int64_t round = 0; round < rounds; ++round) {
      for (int64_t i = 0; i < f.ranks; ++i) {
        const absl::Time due =
            hb_start + interval * (static_cast<double>(round) +
                                   static_cast<double>(i) / static_cast<double>(f.ranks));
        if (due >= hb_end) break;
        if (const absl::Duration early = due - absl::Now(); early > absl::Milliseconds(1)) {
          absl::SleepFor(early);
        }
        beat(i, round + 1);
        ++issued;
      }
    }
    for (; issued < f.ranks * rounds; ++issued) hb_done.Done();  // never issued
  }
  hb_done.WaitFor(absl::Seconds(f.seconds + 120));
  const double hb_seconds = absl::ToDoubleSeconds(absl::Now() - hb_start);
  const double hb_rate = static_cast<double>(heartbeats) / hb_seconds;
  const double hb_p50 = heartbeat_latency.PercentileMs(0.50);
  const double hb_p99 = heartbeat_latency.PercentileMs(0.99);
  const long rss_after_hb = pid ? RssKib(pid) : -1;
  std::printf("%sheartbeats: %ld in %.2f s = %.0f/s (%ld errors), p50 %.2f ms, p99 %.2f ms%s\n",
              label.c_str(), static_cast<long>(heartbeats.load()), hb_seconds, hb_rate,
              static_cast<long>(heartbeat_errors.load()), hb_p50, hb_p99,
              open_loop ? absl::StrFormat(", %.0f/s asked (every rank every %.3g s)",
                                          static_cast<double>(f.ranks) / f.interval, f.interval)
                              .c_str()
                        : "");

  // Phase 4: leave.
  double leave_s = 0;
  result.join_plan_s = join_plan_s;
  result.hb_rate = hb_rate;
  result.hb_p50 = hb_p50;
  result.hb_p99 = hb_p99;
  result.heartbeats = heartbeats.load();
  result.heartbeat_errors = heartbeat_errors.load();
  result.rss_after_join = rss_after_join;
  result.rss_after_hb = rss_after_hb;
  if (!f.stay) {
    Countdown left(f.ranks);
    std::atomic<int64_t> leave_errors{0};
    Mutex first_mu;
    std::string first_leave_error;  // guarded by first_mu
    const absl::Time leave_start = absl::Now();
    for (int64_t i = 0; i < f.ranks; ++i) {
      struct Call {
        grpc::ClientContext context;
        v1::LeaveRequest request;
        v1::LeaveResponse response;
      };
      auto* call = new Call;
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      call->context.AddMetadata(rpc::kJobTokenMetadata, token);
      call->request.set_job_id(f.job);
      call->request.set_rank(assigned[static_cast<size_t>(i)]);
      stubs[static_cast<size_t>(i % f.channels)]->async()->Leave(
          &call->context, &call->request, &call->response, [&, call](grpc::Status s) {
            if (!s.ok() && leave_errors++ == 0) {
              MutexLock lock(&first_mu);
              first_leave_error = absl::StrCat(s.error_code(), " ", s.error_message());
            }
            delete call;
            left.Done();
          });
    }
    left.WaitFor(absl::Seconds(300));
    leave_s = absl::ToDoubleSeconds(absl::Now() - leave_start);
    result.leave_s = leave_s;
    result.leave_errors = leave_errors.load();
    MutexLock lock(&first_mu);
    std::printf("%sleave: %ld ranks in %.3f s (%ld errors%s%s)\n", label.c_str(),
                static_cast<long>(f.ranks), leave_s, static_cast<long>(leave_errors.load()),
                first_leave_error.empty() ? "" : ", the first: ", first_leave_error.c_str());
  }
  result.ok = true;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"coordinator_load: simulated ranks against a zerod daemon"};
  app.add_option("--endpoint", f.endpoint,
                 "zerod endpoint, or several separated by commas (a cluster's members: the ranks "
                 "are spread over them)")
      ->required();
  app.add_option("--job", f.job, "Job id")->capture_default_str();
  app.add_option("--ranks", f.ranks, "Simulated ranks")->capture_default_str();
  app.add_option("--seconds", f.seconds, "Heartbeat phase length")->capture_default_str();
  app.add_option("--channels", f.channels, "gRPC channels (connections)")->capture_default_str();
  app.add_option("--daemon-pid", f.daemon_pid, "zerod's pid, for its RSS (default: find it)");
  app.add_option("--peer-seconds", f.peer_seconds, "Length of the bare gRPC peer measurement")
      ->capture_default_str();
  app.add_option("--token", f.token, "The job's token (default: a new one)");
  app.add_option("--baseline-endpoint", f.baseline_endpoint,
                 "A zerod started with --no-auth: run the load there too and compare");
  app.add_option("--rounds", f.rounds,
                 "With --baseline-endpoint: rounds of one fresh job on each daemon, in "
                 "alternating order")
      ->capture_default_str();
  app.add_flag("--stay", f.stay, "Exit without leaving (ranks are then lost by lease expiry)");
  app.add_option("--interval", f.interval,
                 "Seconds between one rank's heartbeats (open loop); 0: closed loop")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as zerod does
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (f.interval < 0 || (f.interval > 0 && f.seconds / f.interval > 1e6)) {
    std::fprintf(stderr,
                 "coordinator_load: --interval must be 0 or a positive part of --seconds\n");
    return 2;
  }
  if (f.ranks < 1 || f.channels < 1 || f.rounds < 1) {
    std::fprintf(stderr, "coordinator_load: --ranks, --channels and --rounds must be at least 1\n");
    return 2;
  }
  const int64_t pid = f.daemon_pid ? f.daemon_pid : FindDaemon();
  auto channels = MakeChannels(f.endpoint, f.channels);
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (auto& c : channels) stubs.push_back(v1::Coordinator::NewStub(c));
  // The job's token, as zerorun would make it: 32 random bytes in hex.
  if (f.token.empty()) {
    std::random_device random;
    for (int i = 0; i < 8; ++i) f.token += absl::StrFormat("%08x", random());
  }
  // The rounds come first, while neither daemon has served anything: the main load and the peer's
  // thousands of calls in flight below would leave A's gRPC server grown and B's not.
  std::optional<Spread> join_ratio, rate_ratio, p99_ratio;
  if (!f.baseline_endpoint.empty()) {
    auto baseline_channels = MakeChannels(f.baseline_endpoint, f.channels);
    std::vector<std::unique_ptr<v1::Coordinator::Stub>> baseline_stubs;
    for (auto& c : baseline_channels) baseline_stubs.push_back(v1::Coordinator::NewStub(c));
    join_ratio.emplace();
    rate_ratio.emplace();
    p99_ratio.emplace();
    for (int64_t round = 0; round < f.rounds; ++round) {
      // A fresh job on each daemon, and the jobs leave: every round starts from the same state.
      Flags a = f, b = f;
      a.job = absl::StrCat(f.job, "-auth-", round);
      b.job = absl::StrCat(f.job, "-noauth-", round);
      a.stay = b.stay = false;
      const std::string tag = absl::StrCat("round ", round + 1, "/", f.rounds, " ");
      LoadResult with, without;
      if (round % 2 == 0) {
        with = RunLoad(a, stubs, f.token, 0, tag + "with authentication: ");
        without = RunLoad(b, baseline_stubs, f.token, 0, tag + "without authentication: ");
      } else {
        without = RunLoad(b, baseline_stubs, f.token, 0, tag + "without authentication: ");
        with = RunLoad(a, stubs, f.token, 0, tag + "with authentication: ");
      }
      if (!with.ok || !without.ok) return 1;
      join_ratio->Add(with.join_plan_s / without.join_plan_s);
      rate_ratio->Add(with.hb_rate / without.hb_rate);
      p99_ratio->Add(with.hb_p99 / without.hb_p99);
    }
    std::printf(
        "authentication costs, mean of %ld rounds in alternating order (median, min..max): "
        "join+plan %s, heartbeats/s %s, heartbeat p99 %s\n",
        static_cast<long>(f.rounds), join_ratio->Text().c_str(), rate_ratio->Text().c_str(),
        p99_ratio->Text().c_str());
  }
  const LoadResult load = RunLoad(f, stubs, f.token, pid, "");
  if (!load.ok) return 1;

  // Phase 3, the peer: gRPC's health check on the same daemon, same concurrency (capped at the
  // ranks), same channels: the cost of a call with no work behind it.
  const int64_t peer_concurrency = std::min<int64_t>(f.ranks, 4096);
  std::vector<std::unique_ptr<grpc::GenericStub>> generic;
  for (auto& c : channels) generic.push_back(std::make_unique<grpc::GenericStub>(c));
  std::atomic<int64_t> peer_calls{0};
  Latencies peer_latency;
  const absl::Time peer_end = absl::Now() + absl::Seconds(f.peer_seconds);
  Countdown peer_done(peer_concurrency);
  struct Probe {
    grpc::ClientContext context;
    grpc::ByteBuffer request, response;
    absl::Time start;
  };
  std::function<void(int64_t)> probe = [&](int64_t i) {
    auto* p = new Probe;
    grpc::Slice empty("");  // an empty HealthCheckRequest: check the whole server
    p->request = grpc::ByteBuffer(&empty, 1);
    p->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    p->start = absl::Now();
    generic[static_cast<size_t>(i % f.channels)]->UnaryCall(
        &p->context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &p->request, &p->response,
        [&, p, i](grpc::Status s) {
          const absl::Time now = absl::Now();
          peer_latency.Add(absl::ToInt64Microseconds(now - p->start));
          if (s.ok()) ++peer_calls;
          delete p;
          if (now < peer_end && s.ok()) {
            probe(i);
          } else {
            peer_done.Done();
          }
        });
  };
  const absl::Time peer_start = absl::Now();
  for (int64_t i = 0; i < peer_concurrency; ++i) probe(i);
  peer_done.WaitFor(absl::Seconds(f.peer_seconds + 60));
  const double peer_rate =
      static_cast<double>(peer_calls) / absl::ToDoubleSeconds(absl::Now() - peer_start);
  std::printf("peer (bare gRPC health check, %ld in flight): %.0f calls/s, p99 %.2f ms\n",
              static_cast<long>(peer_concurrency), peer_rate, peer_latency.PercentileMs(0.99));

  const double leave_s = load.leave_s;
  const double join_plan_s = load.join_plan_s, hb_rate = load.hb_rate, hb_p50 = load.hb_p50,
               hb_p99 = load.hb_p99;
  const long rss_after_join = load.rss_after_join, rss_after_hb = load.rss_after_hb;
  std::atomic<int64_t> heartbeats{load.heartbeats}, heartbeat_errors{load.heartbeat_errors};
  std::printf(
      "{\"ranks\": %ld, \"channels\": %ld, \"join_plan_s\": %.3f, \"heartbeats\": %ld, "
      "\"heartbeats_per_s\": %.0f, \"heartbeat_p50_ms\": %.3f, \"heartbeat_p99_ms\": %.3f, "
      "\"heartbeat_errors\": %ld, \"heartbeat_interval_s\": %.3f, "
      "\"peer_grpc_calls_per_s\": %.0f, \"leave_s\": %.3f, \"leave_errors\": %ld, "
      "\"daemon_rss_kib_after_join\": %ld, \"daemon_rss_kib\": %ld, "
      "\"auth_rounds\": %ld, \"auth_join_plan_ratio\": %.3f, \"auth_heartbeat_rate_ratio\": %.3f, "
      "\"auth_heartbeat_p99_ratio\": %.3f, \"auth_join_plan_ratio_median\": %.3f, "
      "\"auth_heartbeat_rate_ratio_median\": %.3f}\n",
      static_cast<long>(f.ranks), static_cast<long>(f.channels), join_plan_s,
      static_cast<long>(heartbeats.load()), hb_rate, hb_p50, hb_p99,
      static_cast<long>(heartbeat_errors.load()), f.interval, peer_rate, leave_s,
      static_cast<long>(load.leave_errors), rss_after_join, rss_after_hb,
      static_cast<long>(join_ratio ? f.rounds : 0), join_ratio ? join_ratio->Mean() : 0.0,
      rate_ratio ? rate_ratio->Mean() : 0.0, p99_ratio ? p99_ratio->Mean() : 0.0,
      join_ratio ? join_ratio->Median() : 0.0, rate_ratio ? rate_ratio->Median() : 0.0);
  return 0;
}
