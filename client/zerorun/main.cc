// zerorun: starts N local ranks of a trainer under a zerod job.
//
//   zerorun -n 4 [--endpoint unix:///run/zerod/zerod.sock] [--job NAME] -- PROGRAM ARGS...
//
// Each rank gets ZEROD_ENDPOINT, ZEROD_JOB, ZEROD_JOB_TOKEN, ZEROD_RANK, ZEROD_LOCAL_RANK and
// ZEROD_WORLD_SIZE (ZEROD_GLOO_* and ZEROD_TLS_* pass through). The job token is $ZEROD_JOB_TOKEN
// (give every node's zerorun the same one for a job that spans nodes), else the user's saved token
// of the job, else a new one, saved 0600 under ~/.config/zerod/jobs/ so that the same user's
// `zeroctl end JOB` finds it (client/credentials.h); a job id zerorun made up is forgotten at exit.
// its output lines are prefixed "[rank R] ". SIGINT and SIGTERM are forwarded. When a rank fails,
// the others are stopped (SIGTERM, then SIGKILL after 5 s) and zerorun exits with that rank's
// code (128 + signal when it was killed). Usage errors exit 2.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/credentials.h"

extern char** environ;

namespace {

struct Rank {
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends
  std::string out_line, err_line;
  bool exited = false;
  int code = 0;
};

// Writes complete lines from `pending` with the rank prefix; keeps the partial tail.
void Flush(std::string& pending, int rank, FILE* to, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fprintf(to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start),
                 pending.data() + start);
  }
  pending.erase(0, start);
  if (all && !pending.empty()) {
    std::fprintf(to, "[rank %d] %s\n", rank, pending.c_str());
    pending.clear();
  }
  std::fflush(to);
}

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0;
  std::string endpoint, job;
  std::vector<std::string> command;
  CLI::App app{"zerorun: start N local ranks of a trainer under a zerod job"};
  app.add_option("-n,--nproc", ranks, "Ranks to start")->required();
  app.add_option("--endpoint", endpoint, "zerod endpoint (default $ZEROD_ENDPOINT)");
  app.add_option("--job", job, "Job id (default $ZEROD_JOB, else zerorun-<pid>)");
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

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  const int sfd = signalfd(-1, &signals, SFD_CLOEXEC);

  std::vector<Rank> procs(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      std::perror("zerorun: pipe");
      return 1;
    }
    std::vector<std::string> env_storage;
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "ZEROD_", 6) != 0 || std::strncmp(*e, "ZEROD_GLOO", 10) == 0 ||
          std::strncmp(*e, "ZEROD_TLS_", 10) == 0) {
        env_storage.emplace_back(*e);
      }
    }
    env_storage.push_back("ZEROD_ENDPOINT=" + endpoint);
    env_storage.push_back("ZEROD_JOB=" + job);
    env_storage.push_back("ZEROD_JOB_TOKEN=" + *token);
    env_storage.push_back("ZEROD_RANK=" + std::to_string(r));
    env_storage.push_back("ZEROD_LOCAL_RANK=" + std::to_string(r));
    env_storage.push_back("ZEROD_WORLD_SIZE=" + std::to_string(ranks));
    std::vector<char*> env, args;
    for (auto& e : env_storage) env.push_back(e.data());
    env.push_back(nullptr);
    for (auto& a : command) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    // Each rank leads its own process group, so a signal reaches everything it started.
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
    const int rc = posix_spawnp(&procs[r].pid, args[0], &actions, &attr, args.data(), env.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
      std::cerr << "zerorun: cannot start " << command[0] << ": " << std::strerror(rc) << "\n";
      for (int q = 0; q < r; ++q) kill(-procs[q].pid, SIGTERM);
      if (!job_named) zerod::client::ForgetJobToken(job);
      return 1;
    }
    procs[r].out = out[0];
    procs[r].err = err[0];
  }

  int failed_rank = -1, failed_code = 0, alive = ranks;
  bool stopping = false;
  long kill_deadline_ms = -1;
  auto stop_all = [&](int signal) {
    for (auto& p : procs) {
      if (!p.exited) kill(-p.pid, signal);
    }
  };
  while (alive > 0) {
    std::vector<pollfd> fds = {{sfd, POLLIN, 0}};
    for (auto& p : procs) {
      if (p.out >= 0) fds.push_back({p.out, POLLIN, 0});
      if (p.err >= 0) fds.push_back({p.err, POLLIN, 0});
    }
    poll(fds.data(), fds.size(), kill_deadline_ms >= 0 ? 100 : 1000);
    if (kill_deadline_ms >= 0 && (kill_deadline_ms -= 100) <= 0) {
      stop_all(SIGKILL);
      kill_deadline_ms = -1;
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      if (read(sfd, &info, sizeof(info)) == sizeof(info) && info.ssi_signo != SIGCHLD) {
        stop_all(static_cast<int>(info.ssi_signo));  // forward SIGINT / SIGTERM
      }
    }
    char buf[65536];
    for (int r = 0; r < ranks; ++r) {
      for (int* fd : {&procs[r].out, &procs[r].err}) {
        if (*fd < 0) continue;
        pollfd probe{*fd, POLLIN, 0};
        if (poll(&probe, 1, 0) <= 0) continue;
        const ssize_t n = read(*fd, buf, sizeof(buf));
        std::string& pending = fd == &procs[r].out ? procs[r].out_line : procs[r].err_line;
        FILE* to = fd == &procs[r].out ? stdout : stderr;
        if (n > 0) {
          pending.append(buf, static_cast<size_t>(n));
          Flush(pending, r, to, false);
        } else {
          Flush(pending, r, to, true);
          close(*fd);
          *fd = -1;
        }
      }
    }
    for (int status = 0;;) {
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (int r = 0; r < ranks; ++r) {
        if (procs[r].pid != pid) continue;
        procs[r].exited = true;
        procs[r].code = ExitCode(status);
        --alive;
        if (procs[r].code != 0 && failed_rank < 0 && !stopping) {
          failed_rank = r;
          failed_code = procs[r].code;
          std::fprintf(stderr, "zerorun: rank %d exited with code %d; stopping the others\n", r,
                       failed_code);
          stopping = true;
          stop_all(SIGTERM);
          kill_deadline_ms = 5000;
        }
      }
    }
  }
  // Drain what is left in the pipes, without waiting on a grandchild that still holds one.
  char buf[65536];
  for (int r = 0; r < ranks; ++r) {
    for (int* fd : {&procs[r].out, &procs[r].err}) {
      if (*fd < 0) continue;
      fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
      std::string& pending = fd == &procs[r].out ? procs[r].out_line : procs[r].err_line;
      for (ssize_t n; (n = read(*fd, buf, sizeof(buf))) > 0;)
        pending.append(buf, static_cast<size_t>(n));
      Flush(pending, r, fd == &procs[r].out ? stdout : stderr, true);
      close(*fd);
    }
  }
  // Nobody can reuse a job id made from this process's pid: its token need not be kept.
  if (!job_named) zerod::client::ForgetJobToken(job);
  if (failed_rank >= 0) return failed_code;
  for (const auto& p : procs) {
    if (p.code != 0) return p.code;
  }
  return 0;
}
