// zerorun: starts N local ranks of a trainer under a zerod job.
//
//   zerorun -n 4 [--endpoint unix:///run/zerod/zerod.sock] [--job NAME]
//           [--max-restarts K [--min-ranks M]] -- PROGRAM ARGS...
//
// Each rank gets ZEROD_ENDPOINT, ZEROD_JOB, ZEROD_JOB_TOKEN, ZEROD_RANK, ZEROD_LOCAL_RANK and
// ZEROD_WORLD_SIZE (ZEROD_GLOO_* and ZEROD_TLS_* pass through). The job token is $ZEROD_JOB_TOKEN
// (give every node's zerorun the same one for a job that spans nodes), else the user's saved token
// of the job, else a new one, saved 0600 under ~/.config/zerod/jobs/ so that the same user's
// `zeroctl end JOB` finds it (client/credentials.h); a job id zerorun made up is forgotten at exit.
// Its output lines are prefixed "[rank R] ". SIGINT and SIGTERM are forwarded. When a rank fails,
// the others are stopped (SIGTERM, then SIGKILL after 5 s) and the job is ended at the daemon.
//
// Elastic runs (--max-restarts K): after a failure zerorun ends the job's generation at the
// daemon and starts the world again, up to K times: at the same size (a replacement for the lost
// rank), or with --min-ranks M one rank smaller each time, down to M. Every rank gets
// ZEROD_RESTART (0 on the first attempt) and ZEROD_SNAPSHOT_DIR, a directory in shared memory
// (/dev/shm/zerod-UID-JOB-XXXXXX, this zerorun's own) that outlives the trainers, for their
// in-memory checkpoints; the trainers restore the
// newest complete checkpoint, resharded to the new world (docs/ARCHITECTURE.md, "Elastic
// recovery"). The snapshot directory is removed when zerorun ends.
//
// zerorun exits with the failed rank's code (128 + signal when it was killed) once it gives up,
// 0 when a world finishes cleanly. Usage errors exit 2.

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "client/zerorun/rank_launcher.h"

namespace {

// A directory in shared memory for the ranks' in-memory checkpoints: on tmpfs, so it costs RAM
// rather than disk and survives the trainer processes, not the node. Made afresh for this zerorun
// (mkdtemp: 0700, a name nobody else has), so that neither another user nor another zerorun of
// the same job can read, replace or remove what it holds. Empty when there is none.
std::string SnapshotDirectory(const std::string& job) {
  std::error_code ec;
  if (!std::filesystem::is_directory("/dev/shm", ec)) return "";
  std::string safe;
  for (char c : job.substr(0, 64)) {
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  }
  std::string pattern = "/dev/shm/zerod-" + std::to_string(getuid()) + "-" + safe + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

// Ends the job at the daemon once its world failed, so that the next world forms it again at once
// instead of waiting for the dead ranks' leases to run out. Not found or already ended is fine.
// `restarting`: a restart follows (the message says which). `patience`: how long to ride out a
// daemon that is restarting; short when nothing follows (an unreachable daemon must not hold
// zerorun's exit), longer before a restart, which needs it.
void EndGeneration(const std::string& endpoint, const std::string& job, const std::string& token,
                   bool restarting, absl::Duration patience) {
  zerod::client::ClientOptions options;
  options.endpoint = endpoint;
  options.job_token = token;
  options.retry_for = patience;
  options.call_timeout = std::min(options.call_timeout, patience);
  auto client = zerod::client::CoordinatorClient::Connect(options);
  absl::Status status = client.ok() ? (*client)->EndJob(job) : client.status();
  if (!status.ok() && !absl::IsNotFound(status) && !absl::IsFailedPrecondition(status)) {
    std::cerr << "zerorun: ending job " << job
              << (restarting ? " before the restart: " : " after its ranks failed: ")
              << status.message() << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0, max_restarts = 0, min_ranks = 0;
  std::string endpoint, job;
  std::vector<std::string> command;
  CLI::App app{"zerorun: start N local ranks of a trainer under a zerod job"};
  app.add_option("-n,--nproc", ranks, "Ranks to start")->required();
  app.add_option("--endpoint", endpoint, "zerod endpoint (default $ZEROD_ENDPOINT)");
  app.add_option("--job", job, "Job id (default $ZEROD_JOB, else zerorun-<pid>)");
  app.add_option("--max-restarts", max_restarts,
                 "Start the world again after a failure, up to this many times (0: never)");
  app.add_option("--min-ranks", min_ranks,
                 "With --max-restarts: shrink the world by the lost rank at each restart, down "
                 "to this many ranks, instead of replacing it");
  app.add_option("command", command, "-- PROGRAM ARGS...")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    for (char& c : what) c = c == '\n' ? ' ' : c;
    std::cerr << "zerorun: " << what << "\n";
    return 2;
  }
  if (ranks < 1) {
    std::cerr << "zerorun: -n must be at least 1, got " << ranks << "\n";
    return 2;
  }
  if (max_restarts < 0 || max_restarts > 1000) {
    std::cerr << "zerorun: --max-restarts must be in [0, 1000], got " << max_restarts << "\n";
    return 2;
  }
  if (min_ranks < 0 || min_ranks > ranks || (min_ranks > 0 && max_restarts == 0)) {
    std::cerr << "zerorun: --min-ranks must be in [1, -n] and needs --max-restarts, got "
              << min_ranks << "\n";
    return 2;
  }
  // Each rank holds two pipes here (its stdout and stderr, 4 descriptors until the child has
  // them): check the descriptor limit before forking anything, rather than fork until it runs out.
  // And a node runs one rank per device or core, so thousands of local ranks is a mistake.
  constexpr int kMaxLocalRanks = 4096;
  if (ranks > kMaxLocalRanks) {
    std::cerr << "zerorun: -n " << ranks << " is more local ranks than " << kMaxLocalRanks
              << " (one per GPU or core; a larger job spans nodes)\n";
    return 2;
  }
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
                      static_cast<rlim_t>(4 * ranks + 16) > files.rlim_cur) {
    std::cerr << "zerorun: -n " << ranks << " needs " << 4 * ranks + 16
              << " open files, the limit is " << files.rlim_cur << " (ulimit -n)\n";
    return 2;
  }
  if (endpoint.empty() && std::getenv("ZEROD_ENDPOINT")) endpoint = std::getenv("ZEROD_ENDPOINT");
  if (endpoint.empty()) {
    std::cerr << "zerorun: no zerod endpoint: pass --endpoint or set ZEROD_ENDPOINT\n";
    return 2;
  }
  if (job.empty() && std::getenv("ZEROD_JOB")) job = std::getenv("ZEROD_JOB");
  const bool job_named = !job.empty();
  if (job.empty()) job = "zerorun-" + std::to_string(getpid());
  auto token = zerod::client::JobTokenOrNew(job);
  if (!token.ok()) {
    std::cerr << "zerorun: " << token.status().message() << "\n";
    return 2;
  }

  std::string snapshots;
  if (max_restarts > 0) snapshots = SnapshotDirectory(job);
  int world = ranks;
  int code = 0;
  for (int attempt = 0;; ++attempt) {
    zerod::zerorun::WorldSpec spec;
    spec.ranks = world;
    spec.command = command;
    spec.env = {"ZEROD_ENDPOINT=" + endpoint, "ZEROD_JOB=" + job, "ZEROD_JOB_TOKEN=" + *token,
                "ZEROD_RESTART=" + std::to_string(attempt)};
    if (!snapshots.empty()) spec.env.push_back("ZEROD_SNAPSHOT_DIR=" + snapshots);
    const zerod::zerorun::WorldOutcome outcome = zerod::zerorun::RunWorld(spec);
    if (!outcome.started) {
      code = 1;
      break;
    }
    code = 0;
    for (int c : outcome.codes) code = code == 0 ? c : code;
    if (outcome.first_failed_rank >= 0) code = outcome.first_failed_code;
    if (code == 0) break;
    // The world is gone: its generation ends now, not when the dead ranks' leases run out, so that
    // a restart, or the user running the job again, forms it afresh instead of being taken for
    // the dead ranks retrying their joins.
    const bool restarting = !outcome.interrupted && attempt < max_restarts;
    EndGeneration(endpoint, job, *token, restarting,
                  restarting ? absl::Seconds(20) : absl::Seconds(2));
    if (outcome.interrupted || zerod::zerorun::InterruptPending()) break;
    if (attempt == max_restarts) {
      if (max_restarts > 0) {
        std::cerr << "zerorun: giving up after " << max_restarts << " restart(s)\n";
      }
      break;
    }
    const int next = min_ranks > 0 ? world - 1 : world;
    if (next < std::max(min_ranks, 1)) {
      std::cerr << "zerorun: cannot restart with fewer than " << min_ranks << " ranks\n";
      break;
    }
    std::cerr << "zerorun: restart " << attempt + 1 << " of " << max_restarts << ": " << next
              << " ranks (rank " << outcome.first_failed_rank << " exited with code "
              << outcome.first_failed_code << "; the others were gone "
              << static_cast<long>(outcome.death_to_exit_ms) << " ms later)\n";
    world = next;
  }
  if (!snapshots.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(snapshots, ec);
  }
  // Nobody can reuse a job id made from this process's pid: its token need not be kept.
  if (!job_named) zerod::client::ForgetJobToken(job);
  return code;
}
