#include "server/status/status_views.h"

#include <algorithm>

#include "runtime/plan/shard_plan.h"
#include "server/job.h"

namespace zerod::status {
namespace {

using nlohmann::json;

json HistoryPointJson(const HistoryPoint& p) {
  return {{"unix_ms", p.unix_ms},
          {"step", p.step},
          {"steps_per_second", p.steps_per_second},
          {"bytes_per_step", p.bytes_per_step ? json(*p.bytes_per_step) : json(nullptr)}};
}

json SummaryJson(const v1::JobSummary& s, const JobHistory& history) {
  json j = {{"job_id", s.job_id()},
            {"state", JobStateName(s.state())},
            {"world_size", s.world_size()},
            {"generation", s.generation()},
            {"active_members", s.active_members()},
            {"stage", s.stage()},
            {"params", s.params()},
            {"step", nullptr},
            {"steps_per_second", nullptr}};
  if (std::optional<HistoryPoint> last = history.Last(s.job_id())) {
    j["step"] = last->step;
    j["steps_per_second"] = last->steps_per_second;
  }
  return j;
}

// The rank's memory by category as the plan has it and as the rank reported it (zeroctl memory's
// shape); without a plan yet, only what was reported.
json MemoryJson(const v1::Member& m, const plan::ShardPlan* plan) {
  json planned = json::object(), reported = json::object();
  int64_t reported_total = 0;
  for (const auto& [category, bytes] : m.memory_bytes()) {
    reported[category] = bytes;
    reported_total += bytes;
  }
  json j = {
      {"reported", reported},
      {"reported_total_bytes", m.memory_bytes().empty() ? json(nullptr) : json(reported_total)},
      {"plan", nullptr},
      {"plan_total_bytes", nullptr}};
  if (plan != nullptr && m.rank() < plan->world_size()) {
    const plan::MemoryBreakdown expected = plan->MemoryForRank(m.rank());
    for (int c = 0; c < plan::kMemoryCategoryCount; ++c) {
      const auto category = static_cast<plan::MemoryCategory>(c);
      planned[std::string(plan::MemoryCategoryName(category))] = expected[category];
    }
    j["plan"] = planned;
    j["plan_total_bytes"] = expected.Total();
  }
  return j;
}

json MemberJson(const v1::Member& m, const plan::ShardPlan* plan) {
  json comm = json::object();
  for (const auto& [collective, bytes] : m.comm_bytes()) comm[collective] = bytes;
  return {{"rank", m.rank()},
          {"state", server::MemberStateName(m.state())},
          {"host", m.host()},
          {"device", m.device()},
          {"generation", m.generation()},
          {"step", m.step()},
          {"last_heartbeat_unix_ms",
           m.last_heartbeat_unix_ms() == 0 ? json(nullptr) : json(m.last_heartbeat_unix_ms())},
          {"budget_bytes", m.budget_bytes()},
          {"memory", MemoryJson(m, plan)},
          {"comm_bytes", comm}};
}

// Where each rank's shard lies in the flat parameter buffer: the segments (reduce buckets or
// gather units), each cut into world_size equal slices (one per rank; stage 0 keeps every segment
// whole on every rank), and per member rank its shard's length and how much of it is real.
json ShardMapJson(const plan::ShardPlan& plan, const v1::JobDescription& d) {
  json segments = json::array();
  const auto& all = plan.segments();
  for (size_t i = 0; i < all.size() && i < kMaxSegmentsShown; ++i) {
    const plan::Segment& s = all[i];
    segments.push_back({{"flat_offset", s.flat_offset},
                        {"numel", s.numel},
                        {"padded_numel", s.padded_numel},
                        {"slice_numel", s.slice_numel},
                        {"first_tensor", plan.tensors()[s.first_tensor].name},
                        {"tensor_count", s.tensor_count}});
  }
  json ranks = json::array();
  for (const v1::Member& m : d.members()) {
    if (ranks.size() >= kMaxMembersShown) break;
    if (m.rank() >= plan.world_size()) continue;
    ranks.push_back({{"rank", m.rank()},
                     {"shard_numel", plan.shard_numel()},
                     {"real_numel", plan.OwnedRealNumel(m.rank())}});
  }
  return {{"plan_digest", plan.DigestHex()},
          {"stage", plan.stage()},
          {"world_size", plan.world_size()},
          {"partition_ways", plan.partition_ways()},
          {"total_numel", plan.total_numel()},
          {"padded_numel", plan.padded_numel()},
          {"shard_numel", plan.shard_numel()},
          {"segments_total", all.size()},
          {"segments", segments},
          {"ranks", ranks}};
}

json CheckpointJson(const v1::CheckpointRecord& r) {
  return {{"step", r.step()},
          {"directory", r.directory()},
          {"world_size", r.world_size()},
          {"stage", r.stage()},
          {"state", CheckpointStateName(r.state())},
          {"bytes", r.bytes()},
          {"created_unix_ms", r.created_unix_ms()},
          {"completed_unix_ms",
           r.completed_unix_ms() == 0 ? json(nullptr) : json(r.completed_unix_ms())}};
}

}  // namespace

json JobsView(const server::JobRegistry& registry, const JobHistory& history, absl::Time now) {
  json jobs = json::array();
  for (const v1::JobSummary& s : registry.ListJobs()) jobs.push_back(SummaryJson(s, history));
  return {{"now_unix_ms", absl::ToUnixMillis(now)}, {"jobs", jobs}};
}

absl::StatusOr<json> JobView(const server::JobRegistry& registry,
                             const server::CheckpointRecords* checkpoints,
                             const JobHistory& history, const std::string& job_id, absl::Time now) {
  absl::StatusOr<v1::JobDescription> d = registry.Describe(job_id);
  if (!d.ok()) return d.status();
  // Without a plan (still forming) there is no shard map and no planned memory yet.
  absl::StatusOr<std::shared_ptr<const plan::ShardPlan>> plan = registry.ShardPlanOf(job_id);
  const plan::ShardPlan* shard_plan = plan.ok() ? plan->get() : nullptr;

  json job = SummaryJson(d->summary(), history);
  job["lease_ttl_ms"] = d->lease_ttl_ms();
  job["plan_digest"] = d->plan_digest();
  job["plan_allocated_bytes_per_rank"] = d->plan_allocated_bytes_per_rank();

  json members = json::array();
  for (const v1::Member& m : d->members()) {
    if (members.size() >= kMaxMembersShown) break;
    members.push_back(MemberJson(m, shard_plan));
  }
  json points = json::array();
  for (const HistoryPoint& p : history.Of(job_id)) points.push_back(HistoryPointJson(p));

  json view = {{"now_unix_ms", absl::ToUnixMillis(now)},
               {"job", job},
               {"members_total", d->members_size()},
               {"members", members},
               {"shard_map", shard_plan ? ShardMapJson(*shard_plan, *d) : json(nullptr)},
               {"history", points},
               {"history_max_points", history.max_samples()},
               {"checkpoints", json::array()},
               {"checkpoints_error", nullptr}};
  if (checkpoints != nullptr) {
    absl::StatusOr<std::vector<v1::CheckpointRecord>> records = checkpoints->List(job_id);
    if (records.ok()) {
      for (const v1::CheckpointRecord& r : *records)
        view["checkpoints"].push_back(CheckpointJson(r));
    } else {
      // The job is shown even when its records cannot be read; the page says why.
      view["checkpoints_error"] = std::string(records.status().message());
    }
  }
  return view;
}

std::string JsonText(const json& view) {
  return view.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace zerod::status
