#ifndef ZEROD_SERVER_PLAN_BUILDER_H_
#define ZEROD_SERVER_PLAN_BUILDER_H_

// The plan a job forms with: its layout, options and world size, bounded by the smallest memory
// budget among its members. Pure: JobRegistry stores the result and hands it to every rank.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/plan/shard_plan.h"
#include "server/job.h"
#include "zerod/v1/plan.pb.h"

namespace zerod::server {

struct PlanRequest {
  absl::string_view job_id;
  const std::vector<v1::TensorSpec>& layout;
  absl::string_view layout_digest;
  const v1::PlanOptions& options;
  int64_t world_size = 0;
  int64_t generation = 0;    // the generation the plan starts
  int64_t budget_bytes = 0;  // per rank; 0: unbounded
};

struct BuiltPlan {
  v1::PlanInputs inputs;  // what every rank receives, and what is stored
  std::shared_ptr<const plan::ShardPlan> shard_plan;
};

// Fails, naming the job, when no rank sent the layout or the planner refuses (a budget nothing
// fits: the planner's message says what would).
absl::StatusOr<BuiltPlan> BuildPlan(const PlanRequest& request);

// The smallest budget among live members; 0 when none set one.
int64_t SmallestBudget(const std::map<int64_t, Member>& members);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_PLAN_BUILDER_H_
