#ifndef ZEROD_CLIENT_ZEROCTL_PLAN_COMMAND_H_
#define ZEROD_CLIENT_ZEROCTL_PLAN_COMMAND_H_

// `zeroctl plan`: the memory and communication plan for a model size or layout file, offline
// (no daemon). Exit codes: 0 printed, 2 bad input (one line on stderr).

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

namespace zerod::zeroctl {

// Flags are kept as text and parsed by RunPlan so that every error names the flag and the value.
struct PlanFlags {
  std::string params;
  std::string layout;
  std::string dp;
  std::string stage;
  std::string dtype = "bf16";
  std::string grad_dtype;
  std::string optimizer = "adam";
  std::string budget;
  std::string bucket;
  std::string unit;
  std::string prefetch;
  std::string max_live_units;
  std::string alignment;
  bool json = false;
};

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags& flags);

int RunPlan(const PlanFlags& flags, std::ostream& out, std::ostream& err);

}  // namespace zerod::zeroctl

#endif  // ZEROD_CLIENT_ZEROCTL_PLAN_COMMAND_H_
