#ifndef ZEROD_CLIENT_ZEROCTL_CHECKPOINT_COMMANDS_H_
#define ZEROD_CLIENT_ZEROCTL_CHECKPOINT_COMMANDS_H_

// `zeroctl checkpoint verify DIR`, `zeroctl checkpoint export DIR --out FILE.safetensors` and
// `zeroctl checkpoint upgrade DIR` (a format-1 manifest given its checksum): a sharded checkpoint
// on disk, offline (no daemon). Exit codes: 0 done, 1 the checkpoint is damaged, partial or
// missing, or the export could not be written, 2 usage error, an --out that is not a regular file
// (a link, a device, a FIFO, a directory) included (one line on stderr each time).

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

namespace zerod::zeroctl {

struct CheckpointFlags {
  std::string dir;
  std::string out;  // export
};

// Adds `checkpoint` with its subcommands `verify`, `export` and `upgrade`.
CLI::App* AddCheckpointCommand(CLI::App& app, CheckpointFlags& flags);

// Runs whichever subcommand of `checkpoint` was parsed.
int RunCheckpoint(const CLI::App& checkpoint, const CheckpointFlags& flags, std::ostream& out,
                  std::ostream& err);

}  // namespace zerod::zeroctl

#endif  // ZEROD_CLIENT_ZEROCTL_CHECKPOINT_COMMANDS_H_
