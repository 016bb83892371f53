#include "client/zerorun/rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>

extern char** environ;

namespace zerod::zerorun {
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

// The signals zerorun handles, as a descriptor; they are blocked for the process's threads so
// that only this descriptor sees them (and the ranks start with an empty mask).
int SignalDescriptor() {
  static const int fd = [] {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGCHLD);
    sigprocmask(SIG_BLOCK, &signals, nullptr);
    return signalfd(-1, &signals, SFD_CLOEXEC);
  }();
  return fd;
}

bool Spawn(const WorldSpec& spec, int r, Rank& rank) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    std::perror("zerorun: pipe");
    return false;
  }
  std::vector<std::string> env_storage;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "ZEROD_", 6) != 0 || std::strncmp(*e, "ZEROD_GLOO", 10) == 0 ||
        std::strncmp(*e, "ZEROD_TLS_", 10) == 0) {
      env_storage.emplace_back(*e);
    }
  }
  env_storage.insert(env_storage.end(), spec.env.begin(), spec.env.end());
  env_storage.push_back("ZEROD_RANK=" + std::to_string(r));
  env_storage.push_back("ZEROD_LOCAL_RANK=" + std::to_string(r));
  env_storage.push_back("ZEROD_WORLD_SIZE=" + std::to_string(spec.ranks));
  std::vector<std::string> command = spec.command;
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
  const int rc = posix_spawnp(&rank.pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    std::cerr << "zerorun: cannot start " << command[0] << ": " << std::strerror(rc) << "\n";
    close(out[0]);
    close(err[0]);
    return false;
  }
  rank.out = out[0];
  rank.err = err[0];
  return true;
}

// Copies what a rank wrote to `fd` to ours, line by line; closes it at the end of the stream.
void Forward(Rank& rank, int r, int* fd) {
  char buf[65536];
  pollfd probe{*fd, POLLIN, 0};
  if (poll(&probe, 1, 0) <= 0) return;
  const ssize_t n = read(*fd, buf, sizeof(buf));
  std::string& pending = fd == &rank.out ? rank.out_line : rank.err_line;
  FILE* to = fd == &rank.out ? stdout : stderr;
  if (n > 0) {
    pending.append(buf, static_cast<size_t>(n));
    Flush(pending, r, to, false);
  } else {
    Flush(pending, r, to, true);
    close(*fd);
    *fd = -1;
  }
}

// Drains what is left in the pipes, without waiting on a grandchild that still holds one.
void Drain(std::vector<Rank>& procs) {
  char buf[65536];
  for (size_t r = 0; r < procs.size(); ++r) {
    for (int* fd : {&procs[r].out, &procs[r].err}) {
      if (*fd < 0) continue;
      fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
      std::string& pending = fd == &procs[r].out ? procs[r].out_line : procs[r].err_line;
      for (ssize_t n; (n = read(*fd, buf, sizeof(buf))) > 0;)
        pending.append(buf, static_cast<size_t>(n));
      Flush(pending, static_cast<int>(r), fd == &procs[r].out ? stdout : stderr, true);
      close(*fd);
      *fd = -1;
    }
  }
}

}  // namespace

bool InterruptPending() {
  const int sfd = SignalDescriptor();
  for (pollfd ready{sfd, POLLIN, 0}; poll(&ready, 1, 0) > 0;) {
    signalfd_siginfo info{};
    if (read(sfd, &info, sizeof(info)) != sizeof(info)) return false;
    if (info.ssi_signo != SIGCHLD) return true;
  }
  return false;
}

WorldOutcome RunWorld(const WorldSpec& spec) {
  WorldOutcome outcome;
  const int sfd = SignalDescriptor();
  std::vector<Rank> procs(static_cast<size_t>(spec.ranks));
  for (int r = 0; r < spec.ranks; ++r) {
    if (!Spawn(spec, r, procs[r])) {
      for (int q = 0; q < r; ++q) kill(-procs[q].pid, SIGTERM);
      for (int q = 0; q < r; ++q) waitpid(procs[q].pid, nullptr, 0);
      Drain(procs);
      return outcome;
    }
  }
  outcome.started = true;

  int alive = spec.ranks;
  bool stopping = false;
  // When the ranks still alive after a failure get SIGKILL: 5 s of the clock, however often
  // their output wakes the loop.
  bool kill_pending = false;
  std::chrono::steady_clock::time_point kill_at;
  std::chrono::steady_clock::time_point first_death;
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
    poll(fds.data(), fds.size(), kill_pending ? 100 : 1000);
    if (kill_pending && std::chrono::steady_clock::now() >= kill_at) {
      stop_all(SIGKILL);
      kill_pending = false;
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      if (read(sfd, &info, sizeof(info)) == sizeof(info) && info.ssi_signo != SIGCHLD) {
        outcome.interrupted = true;
        stop_all(static_cast<int>(info.ssi_signo));  // forward SIGINT / SIGTERM
      }
    }
    for (int r = 0; r < spec.ranks; ++r) {
      for (int* fd : {&procs[r].out, &procs[r].err}) {
        if (*fd >= 0) Forward(procs[r], r, fd);
      }
    }
    for (int status = 0;;) {
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (int r = 0; r < spec.ranks; ++r) {
        if (procs[r].pid != pid) continue;
        procs[r].exited = true;
        procs[r].code = ExitCode(status);
        --alive;
        if (procs[r].code != 0 && outcome.first_failed_rank < 0 && !stopping) {
          outcome.first_failed_rank = r;
          outcome.first_failed_code = procs[r].code;
          first_death = std::chrono::steady_clock::now();
          std::fprintf(stderr, "zerorun: rank %d exited with code %d; stopping the others\n", r,
                       procs[r].code);
          stopping = true;
          stop_all(SIGTERM);
          kill_at = first_death + std::chrono::seconds(5);
          kill_pending = true;
        }
      }
    }
  }
  Drain(procs);
  for (const Rank& p : procs) outcome.codes.push_back(p.code);
  if (outcome.first_failed_rank >= 0) {
    outcome.death_to_exit_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_death)
            .count();
  }
  return outcome;
}

}  // namespace zerod::zerorun
