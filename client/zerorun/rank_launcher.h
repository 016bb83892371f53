#ifndef ZEROD_CLIENT_ZERORUN_RANK_LAUNCHER_H_
#define ZEROD_CLIENT_ZERORUN_RANK_LAUNCHER_H_

// Starts one world of local ranks and supervises it until every rank has exited: output lines
// prefixed "[rank R] ", SIGINT and SIGTERM forwarded, and when a rank fails the others are stopped
// (SIGTERM, then SIGKILL after 5 s). zerorun runs one world per attempt.

#include <string>
#include <vector>

namespace zerod::zerorun {

struct WorldSpec {
  int ranks = 0;
  std::vector<std::string> command;
  // Added to every rank's environment (besides ZEROD_RANK, ZEROD_LOCAL_RANK, ZEROD_WORLD_SIZE),
  // after the parent's non-ZEROD_ variables and its ZEROD_GLOO_* and ZEROD_TLS_* ones.
  std::vector<std::string> env;
};

struct WorldOutcome {
  bool started = false;         // false: a rank could not be started (error printed)
  bool interrupted = false;     // SIGINT or SIGTERM reached zerorun
  int first_failed_rank = -1;   // the rank whose failure stopped the others, or -1
  int first_failed_code = 0;    // its code (128 + signal when killed)
  std::vector<int> codes;       // every rank's code, by rank
  double death_to_exit_ms = 0;  // from the first failure until the last rank was gone
};

// Blocks SIGINT, SIGTERM and SIGCHLD for the calling thread on first use (they arrive through a
// signalfd).
WorldOutcome RunWorld(const WorldSpec& spec);

// Whether SIGINT or SIGTERM reached zerorun since the last world ended (between worlds nobody
// forwards them): a restart must not start a world the user asked to stop.
bool InterruptPending();

}  // namespace zerod::zerorun

#endif  // ZEROD_CLIENT_ZERORUN_RANK_LAUNCHER_H_
