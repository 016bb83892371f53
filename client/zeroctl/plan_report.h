#ifndef ZEROD_CLIENT_ZEROCTL_PLAN_REPORT_H_
#define ZEROD_CLIENT_ZEROCTL_PLAN_REPORT_H_

// Renders the plans of stages 0-3 for one model as text tables or one JSON object.

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/plan/shard_plan.h"

namespace zerod::zeroctl {

struct PlanReport {
  std::string source;                   // "synthetic layout: 1024 tensors" or the file name
  std::vector<plan::ShardPlan> stages;  // stages 0..3, in order
  std::optional<int64_t> budget_bytes;
  std::optional<int> selected_stage;  // --stage, or auto's choice
  std::string selection_reason;       // why auto chose it, when it did
};

void PrintPlanText(const PlanReport& report, std::ostream& out);
nlohmann::json PlanJson(const PlanReport& report);

}  // namespace zerod::zeroctl

#endif  // ZEROD_CLIENT_ZEROCTL_PLAN_REPORT_H_
