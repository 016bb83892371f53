#ifndef ZEROD_CLIENT_ZEROCTL_LIVE_COMMANDS_H_
#define ZEROD_CLIENT_ZEROCTL_LIVE_COMMANDS_H_

// zeroctl's commands against a live daemon: jobs, members, shards, memory, watch, checkpoints
// (read-only), and end (the job's owner or an admin: the job's token, found as
// client/credentials.h says, or the admin token).
// Exit codes: 0 success, 1 server error, 2 usage error (one line on stderr each time).

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace zerod::zeroctl {

struct LiveFlags {
  std::string endpoint;  // shared by every live command; empty: $ZEROD_ENDPOINT
  std::string job;
  std::string rank;  // shards: one rank's ranges
  std::string tensor;
  std::string timeout = "10s";
  bool json = false;
  std::string token_file;        // end: the job's token
  std::string admin_token_file;  // end: default $ZEROD_ADMIN_TOKEN_FILE, else
                                 // /var/lib/zerod/admin.token when readable
};

// Adds --endpoint, --json and --timeout to `app`: to zeroctl itself, so they may come before the
// subcommand (`zeroctl --endpoint E jobs`) as kubectl's and etcdctl's global flags do, and to each
// live subcommand, after its name. Both fill the same fields; `zeroctl plan` reads only --json.
void AddGlobalFlags(CLI::App& app, LiveFlags& flags);

// Adds the subcommands; returns them in the order jobs, members, shards, memory, watch,
// checkpoints, end.
std::vector<CLI::App*> AddLiveCommands(CLI::App& app, LiveFlags& flags);

// Runs whichever of the subcommands was parsed.
int RunLive(const std::string& command, const LiveFlags& flags, std::ostream& out,
            std::ostream& err);

}  // namespace zerod::zeroctl

#endif  // ZEROD_CLIENT_ZEROCTL_LIVE_COMMANDS_H_
