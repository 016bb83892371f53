#ifndef ZEROD_SERVER_JOB_H_
#define ZEROD_SERVER_JOB_H_

// In-memory state of one job and its members, guarded by the job's own mutex so that work on
// one job (heartbeats above all) never waits for another.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "runtime/plan/shard_plan.h"
#include "server/rank_slots.h"
#include "zerod/v1/coordinator.pb.h"
#include "zerod/v1/plan.pb.h"

namespace zerod::server {

struct JoinResult {
  int64_t rank = 0;
  int64_t generation = 0;
  int64_t world_size = 0;
  absl::Duration lease_ttl;
  // The serialized v1::PlanInputs, encoded once and shared by every rank's answer.
  std::shared_ptr<const std::string> plan_bytes;
};
using JoinCallback = std::function<void(absl::StatusOr<JoinResult>)>;

// Receives a job's events (a Watch stream). Send and Close must not block or call back into the
// registry.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void Send(const v1::JobEvent& event) = 0;
  virtual void Close(const absl::Status& status) = 0;
};

struct Member {
  v1::MemberState state = v1::MEMBER_JOINING;
  std::string host;
  std::string device;
  int64_t budget_bytes = 0;
  std::string layout_digest;
  int64_t generation = 0;  // the generation it joined
  // Live statistics (never written to disk).
  absl::Time lease_expiry = absl::InfinitePast();
  int64_t last_heartbeat_unix_ms = 0;
  int64_t step = 0;
  std::map<std::string, int64_t> memory_bytes;
  std::map<std::string, int64_t> comm_bytes;
  // While JOINING: the waiting Join call.
  int64_t ticket = 0;
  JoinCallback waiter;
};

// JOINING or ACTIVE: the member holds its rank.
bool IsLive(const Member& member);
// "joining", "active", "lost", "left", for messages.
const char* MemberStateName(v1::MemberState state);

struct Job {
  explicit Job(std::string job_id) : id(std::move(job_id)) {}

  const std::string id;
  Mutex mu;
  int64_t world_size ABSL_GUARDED_BY(mu) = 0;
  int64_t generation ABSL_GUARDED_BY(mu) = 0;
  v1::JobState state ABSL_GUARDED_BY(mu) = v1::JOB_FORMING;
  v1::PlanOptions options ABSL_GUARDED_BY(mu);
  std::string layout_digest ABSL_GUARDED_BY(mu);
  int64_t layout_digest_rank ABSL_GUARDED_BY(mu) = -1;     // the rank whose digest set it
  std::vector<v1::TensorSpec> layout ABSL_GUARDED_BY(mu);  // from the first rank that sent it
  // By rank, only the ranks that joined: a job costs what joined, not the world it declares.
  std::map<int64_t, Member> members ABSL_GUARDED_BY(mu);
  RankSlots slots ABSL_GUARDED_BY(mu);  // which ranks are live, free, lost
  // The ranks that left, as every heartbeat's answer lists them: found by a walk over the members
  // once after they changed, not once per heartbeat, which made a heartbeat cost O(world size).
  // Whatever changes members forgets it (ForgetLeftRanks in job_registry.cc).
  std::optional<std::vector<int64_t>> left_ranks ABSL_GUARDED_BY(mu);
  bool forming ABSL_GUARDED_BY(mu) = false;  // a formation commit is in flight
  absl::Time formation_started ABSL_GUARDED_BY(mu);
  std::optional<v1::PlanInputs> plan ABSL_GUARDED_BY(mu);
  std::shared_ptr<const std::string> plan_bytes ABSL_GUARDED_BY(mu);
  std::shared_ptr<const plan::ShardPlan> shard_plan ABSL_GUARDED_BY(mu);
  std::map<int64_t, std::shared_ptr<EventSink>> watchers ABSL_GUARDED_BY(mu);
  int64_t next_ticket ABSL_GUARDED_BY(mu) = 1;
  // Taken out of the registry (it never formed and nobody is left in it): a call that still
  // holds it must look it up again.
  bool removed ABSL_GUARDED_BY(mu) = false;
};

// The member at `rank`, or nullptr when none joined there.
Member* MemberAt(Job& job, int64_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
const Member* MemberAt(const Job& job, int64_t rank) ABSL_SHARED_LOCKS_REQUIRED(job.mu);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOB_H_
