#ifndef ZEROD_SERVER_STATUS_STATUS_VIEWS_H_
#define ZEROD_SERVER_STATUS_STATUS_VIEWS_H_

// The status page's JSON: what /api/jobs and /api/jobs/<id> answer, built from the registry, the
// checkpoint records and the job history. Read-only, and bounded whatever a job declares: members,
// shard-map ranks and segments are listed up to a cap, with the totals beside them.
//
// Strings in these views (job ids, hosts, devices, tensor names, checkpoint directories) are what
// ranks sent: the page must show them as text, never as markup (page.html does).

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "proto/state_names.h"
#include "server/checkpoint_records.h"
#include "server/job_registry.h"
#include "server/status/job_history.h"

namespace zerod::status {

// What one job view lists at most (each list says its total beside it).
inline constexpr size_t kMaxMembersShown = 1024;
inline constexpr size_t kMaxSegmentsShown = 1024;

// {"now_unix_ms", "jobs": [{job_id, state, world_size, generation, active_members, stage, params,
// step, steps_per_second}]}: every job, ordered by id; step and rate from the history (null when
// none yet).
nlohmann::json JobsView(const server::JobRegistry& registry, const JobHistory& history,
                        absl::Time now);

// One job: its summary and plan, members (state, host, device, step, last heartbeat, memory
// against the plan), shard map, history and checkpoints (`checkpoints` may be null: none listed).
// NOT_FOUND (or DATA_LOSS for a quarantined job) when the registry does not hold it.
absl::StatusOr<nlohmann::json> JobView(const server::JobRegistry& registry,
                                       const server::CheckpointRecords* checkpoints,
                                       const JobHistory& history, const std::string& job_id,
                                       absl::Time now);

// The view as JSON text. Bytes that are not UTF-8 (a rank may send any) become U+FFFD instead of
// failing the whole answer.
std::string JsonText(const nlohmann::json& view);

// The state names the views use (shared with /metrics).
using proto::CheckpointStateName;
using proto::JobStateName;

}  // namespace zerod::status

#endif  // ZEROD_SERVER_STATUS_STATUS_VIEWS_H_
