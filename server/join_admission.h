#ifndef ZEROD_SERVER_JOIN_ADMISSION_H_
#define ZEROD_SERVER_JOIN_ADMISSION_H_

// Join admission: whether a join may enter its job and how, decided from the join's arguments and
// a view of the job alone (no I/O, no locks), so that every rule has its own test. JobRegistry
// takes the view and applies the decision under the job's lock.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/job.h"
#include "zerod/v1/plan.pb.h"

namespace zerod::server {

struct JoinArgs {
  std::string job_id;
  int64_t world_size = 0;
  int64_t rank = -1;  // -1: any free rank
  std::string host;
  std::string device;
  int64_t budget_bytes = 0;  // 0: unbounded
  std::vector<v1::TensorSpec> layout;
  std::string layout_digest;
  v1::PlanOptions options;
};

// The most any world may be, whatever a daemon is configured with: what job records accept.
inline constexpr int64_t kHardMaxWorldSize = int64_t{1} << 24;
inline constexpr int64_t kDefaultMaxJobIdBytes = 128;

// What a join may declare (zerod's --max-world-size and --max-job-id-bytes).
struct JoinLimits {
  // 2^20: ten times the 100,000 ranks zerod is built to coordinate.
  int64_t max_world_size = int64_t{1} << 20;
  int64_t max_job_id_bytes = kDefaultMaxJobIdBytes;
};

// Checks a job id: 1..max_bytes characters from [A-Za-z0-9._-].
absl::Status ValidateJobId(const std::string& job_id, int64_t max_bytes = kDefaultMaxJobIdBytes);

// A job id as error messages show it: whole when it could be valid, else its first 64 bytes and
// its length, so a megabyte-long id in a request is not echoed back into the reply.
std::string ShownJobId(const std::string& job_id);
// A store key (or barrier name, or any other string a caller chose) as error messages show it:
// whole up to 64 bytes, else its first 64 bytes and its length.
std::string ShownKey(absl::string_view key);

// Checks what a join says on its own, before any job is looked at: the job id, the world size
// (1..limits.max_world_size), the rank, the budget, host, device and layout digest up to
// kMaxNameBytes, the plan options, and that the layout (when sent) has the digest the join claims.
absl::Status CheckJoinArgs(const JoinArgs& args, const JoinLimits& limits = {});

inline constexpr size_t kMaxNameBytes = 256;

// Plan options as the wire carries them: known enum values, no negative sizes, what
// plan::ValidatePlanInput requires of them, and agreed settings within kMaxAgreedOptions entries
// of names up to kMaxNameBytes and values up to kMaxAgreedValueBytes. The message names the field
// and the value.
absl::Status CheckPlanOptions(const v1::PlanOptions& options);
inline constexpr int kMaxAgreedOptions = 4096;
inline constexpr size_t kMaxAgreedValueBytes = 4096;

// The first of `asked`'s options (a field, or an agreed setting) that differs from `formed`'s,
// as "stage 2 ... stage 3" text for a refusal; nullopt when they are the same.
struct OptionDifference {
  std::string name;
  std::string asked;
  std::string formed;
};
std::optional<OptionDifference> FirstOptionDifference(const v1::PlanOptions& formed,
                                                      const v1::PlanOptions& asked);
// Where `asked` first differs from `formed` (name, shape, dtype, unit, or a tensor one has and the
// other lacks), as text naming the tensor's index; nullopt when they are the same.
std::optional<std::string> FirstLayoutDifference(absl::Span<const v1::TensorSpec> formed,
                                                 absl::Span<const v1::TensorSpec> asked,
                                                 int64_t formed_rank, const std::string& asker);

// The job as admission sees it. Copies nothing per rank: a join looks at one rank at most.
struct JobAdmissionView {
  absl::string_view job_id;
  bool forming = false;  // the plan of a formation is being stored
  int64_t live_members = 0;
  int64_t world_size = 0;
  int64_t generation = 0;
  bool running = false;  // formed: it has a plan and is RUNNING
  absl::string_view layout_digest;
  int64_t layout_digest_rank = -1;  // the rank that formed the job: its digest and options
  // What the job was formed with: its options, and its layout when a rank sent one (every rank
  // admitted since has the same digest). A join that differs is refused naming what differs.
  const v1::PlanOptions* options = nullptr;
  absl::Span<const v1::TensorSpec> layout;
  const Member* holder = nullptr;  // the member recorded at the join's rank, if it names one
  std::optional<int64_t> lowest_free_rank;
};

// Refuse the join with `status`.
struct RefuseJoin {
  absl::Status status;
};
// The rank is active in the running job and the same process asks again: its answer was lost
// (a daemon restart). Answer it as at formation.
struct AnswerAgain {
  int64_t rank = 0;
};
// Enter `rank` and wait for the job to form.
struct AwaitFormation {
  int64_t rank = 0;
  // Nobody is live: the job re-forms with this join's world size, layout and options.
  bool reform = false;
  // The same process already waits at `rank` (a retry): this join replaces that one.
  bool supersede = false;
};
using JoinDecision = std::variant<RefuseJoin, AnswerAgain, AwaitFormation>;

// Decides a join whose arguments passed CheckJoinArgs.
JoinDecision DecideJoin(const JobAdmissionView& job, const JoinArgs& args);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOIN_ADMISSION_H_
