// zeroctl: inspect and plan zerod jobs. Exit codes: 0 success, 1 server error, 2 usage error.

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/zeroctl/checkpoint_commands.h"
#include "client/zeroctl/live_commands.h"
#include "client/zeroctl/plan_command.h"

namespace {

// CLI11 messages can span lines; a usage error is one line on stderr.
std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// CLI11 reports a mistyped subcommand as "a subcommand is required" or as an unexpected
// argument; the user needs the word it did not know and the words it does.
std::string UnknownCommand(const CLI::App& app, const std::vector<CLI::App*>& commands) {
  if (!app.get_subcommands().empty()) return "";
  for (const std::string& arg : app.remaining()) {
    if (arg.empty() || arg[0] == '-') continue;
    std::string known;
    for (const CLI::App* command : commands) {
      known += (known.empty() ? "" : ", ") + command->get_name();
    }
    return "unknown command '" + arg + "' (expected one of: " + known + ")";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zeroctl: plan ZeRO partitioning and inspect zerod jobs"};
  app.require_subcommand(1);
  zerod::zeroctl::LiveFlags live_flags;
  zerod::zeroctl::AddGlobalFlags(app, live_flags);
  zerod::zeroctl::PlanFlags plan_flags;
  CLI::App* plan = zerod::zeroctl::AddPlanCommand(app, plan_flags);
  const std::vector<CLI::App*> live = zerod::zeroctl::AddLiveCommands(app, live_flags);
  zerod::zeroctl::CheckpointFlags checkpoint_flags;
  CLI::App* checkpoint = zerod::zeroctl::AddCheckpointCommand(app, checkpoint_flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::vector<CLI::App*> commands = {plan};
    commands.insert(commands.end(), live.begin(), live.end());
    commands.push_back(checkpoint);
    const std::string unknown = UnknownCommand(app, commands);
    std::cerr << "zeroctl: " << (unknown.empty() ? OneLine(e.what()) : unknown) << "\n";
    return 2;
  }
  try {
    if (plan->parsed()) {
      plan_flags.json = plan_flags.json || live_flags.json;  // `zeroctl --json plan ...`
      return zerod::zeroctl::RunPlan(plan_flags, std::cout, std::cerr);
    }
    if (checkpoint->parsed()) {
      return zerod::zeroctl::RunCheckpoint(*checkpoint, checkpoint_flags, std::cout, std::cerr);
    }
    for (CLI::App* command : live) {
      if (command->parsed()) {
        return zerod::zeroctl::RunLive(command->get_name(), live_flags, std::cout, std::cerr);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "zeroctl: internal error: " << OneLine(e.what()) << "\n";
    return 1;
  }
  return 2;
}
