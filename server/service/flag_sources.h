#ifndef ZEROD_SERVER_SERVICE_FLAG_SOURCES_H_
#define ZEROD_SERVER_SERVICE_FLAG_SOURCES_H_

// Where zerod's settings come from. Every flag, those added later too, can also be given in the
// environment and in a TOML config file, with no code per flag. The one order (docs/operators.md
// "Running zerod as a service" has the same table):
//
//   1. the command line           --data-dir /srv/zerod
//   2. the environment            ZEROD_DATA_DIR=/srv/zerod   (ZEROD_ + the flag, upper case, _)
//   3. the config file            data-dir = "/srv/zerod"     (--config FILE or ZEROD_CONFIG)
//   4. the flag's default
//
// Flags without a variable: --reset-state (an action for one start: a variable left set would
// reset every start), and those whose ZEROD_ name is the client side's already: the SDK, zeroctl
// and zerorun read ZEROD_TLS_* (zerorun passes them to ranks), ZEROD_ADMIN_TOKEN_FILE and
// ZEROD_VIEWER_TOKEN_FILE; a shell set up for zeroctl must not reconfigure a daemon started from
// it. A key in the file that is not a flag is an error naming it, as is a TOML [section] (zerod
// has no sections).

#include <optional>
#include <string>

#include "CLI/CLI.hpp"

namespace zerod::server::service {

// Parses argv, the environment and the config file into `app`'s options (all added before the
// call). Returns nullopt to go on, or the exit code: 0 after --help, 2 after a usage error, whose
// one line has gone to stderr.
std::optional<int> ParseFlagSources(CLI::App& app, int argc, char** argv);

// The variable that sets `flag` ("--data-dir" -> "ZEROD_DATA_DIR"), or "" when it has none.
std::string EnvironmentVariableOf(const std::string& flag);

}  // namespace zerod::server::service

#endif  // ZEROD_SERVER_SERVICE_FLAG_SOURCES_H_
