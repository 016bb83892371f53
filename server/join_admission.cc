#include "server/join_admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/plan_input.h"

namespace zerod::server {
namespace {

std::string Short(absl::string_view digest) { return absl::StrCat(digest.substr(0, 8), ".."); }

// "job J: rank R" (or "rank any"), the prefix of most refusals.
std::string Who(const JoinArgs& args) {
  return absl::StrCat("job ", args.job_id, ": rank ",
                      args.rank < 0 ? "any" : absl::StrCat(args.rank));
}

// Why a job with live members cannot take this join at all, if it cannot.
std::optional<absl::Status> Mismatch(const JobAdmissionView& job, const JoinArgs& args) {
  if (args.world_size != job.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", args.job_id, " has world size ", job.world_size, "; rank ",
        args.rank < 0 ? "any" : absl::StrCat(args.rank), " asked for ", args.world_size,
        " (end the job, or let every rank leave, to re-form it with another size)"));
  }
  if (args.layout_digest != job.layout_digest) {
    return absl::FailedPreconditionError(
        absl::StrCat(Who(args), " layout digest ", Short(args.layout_digest), " differs from rank ",
                     job.layout_digest_rank, " (", Short(job.layout_digest), ")"));
  }
  return std::nullopt;
}

// A join that names its rank, in a job whose world and layout it matches.
JoinDecision DecideNamedRank(const JobAdmissionView& job, const JoinArgs& args) {
  const Member* m = job.holder;
  if (m == nullptr || !IsLive(*m)) return AwaitFormation{.rank = args.rank};
  if (m->host != args.host || m->device != args.device) {
    return RefuseJoin{absl::AlreadyExistsError(
        absl::StrCat("job ", args.job_id, ": rank ", args.rank, " is held by host '", m->host,
                     "' device '", m->device, "' (", MemberStateName(m->state), ")"))};
  }
  if (m->state == v1::MEMBER_JOINING) return AwaitFormation{.rank = args.rank, .supersede = true};
  if (job.running) return AnswerAgain{.rank = args.rank};
  // Active, but the job moved on (a rank was lost or left): this process must re-join through
  // a new generation, not take its old answer.
  return RefuseJoin{
      absl::AlreadyExistsError(absl::StrCat("job ", args.job_id, ": rank ", args.rank,
                                            " is already active in generation ", job.generation))};
}

}  // namespace

std::string ShownJobId(const std::string& job_id) {
  if (job_id.size() <= 128) return job_id;
  return absl::StrCat(job_id.substr(0, 64), "... (", job_id.size(), " bytes)");
}

std::string ShownKey(absl::string_view key) {
  if (key.size() <= 64) return std::string(key);
  return absl::StrCat(key.substr(0, 64), "... (", key.size(), " bytes)");
}

absl::Status ValidateJobId(const std::string& job_id, int64_t max_bytes) {
  if (job_id.empty()) return absl::InvalidArgumentError("job id is empty");
  if (static_cast<int64_t>(job_id.size()) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("job id '", job_id.substr(0, 32), "...' is ",
                                                   job_id.size(), " bytes, longer than ", max_bytes,
                                                   " (--max-job-id-bytes)"));
  }
  for (char c : job_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("job id '", ShownJobId(job_id), "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPlanOptions(const v1::PlanOptions& o) {
  // Values the wire can carry that no plan means: an enum value no version defines, a negative
  // size. (0 and UNSPECIFIED keep their meaning: the default.)
  if (!v1::DType_IsValid(o.param_dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("param_dtype ", o.param_dtype(), " is unknown"));
  }
  if (!v1::DType_IsValid(o.grad_dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("grad_dtype ", o.grad_dtype(), " is unknown"));
  }
  if (!v1::Optimizer_IsValid(o.optimizer())) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", o.optimizer(), " is unknown"));
  }
  if (o.stage() != plan::kAutoStage && (o.stage() < 0 || o.stage() > 3)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage must be 0, 1, 2, 3 or auto (-1), got ", o.stage()));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"partition_alignment_numel", o.partition_alignment_numel()},
        {"reduce_bucket_bytes", o.reduce_bucket_bytes()},
        {"bucket_buffers", o.bucket_buffers()},
        {"gather_unit_bytes", o.gather_unit_bytes()},
        {"prefetch_depth", o.prefetch_depth()},
        {"max_live_units", o.max_live_units()}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be 0 (the default) or positive, got ", value));
    }
  }
  plan::PlanInput probe;
  probe.tensors = {{"probe", {1}, DType::kFloat32, ""}};
  probe.options = rpc::FromProto(o);
  return plan::ValidatePlanInput(probe);
}

absl::Status CheckJoinArgs(const JoinArgs& args, const JoinLimits& limits) {
  if (absl::Status s = ValidateJobId(args.job_id, limits.max_job_id_bytes); !s.ok()) return s;
  const int64_t max_world = std::min(limits.max_world_size, kHardMaxWorldSize);
  if (args.world_size < 1 || args.world_size > max_world) {
    return absl::InvalidArgumentError(absl::StrCat(Who(args), ": world size must be 1..", max_world,
                                                   " (--max-world-size), got ", args.world_size));
  }
  if (args.rank < -1 || args.rank >= args.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("job ", args.job_id, ": rank ", args.rank,
                                                   " is out of range for world size ",
                                                   args.world_size));
  }
  if (args.layout_digest.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Who(args), ": no layout digest"));
  }
  if (args.budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Who(args), ": budget must be 0 (unbounded) or positive, got ", args.budget_bytes));
  }
  // A host or device name is a few dozen characters; a 40 MB one was stored and made every
  // DescribeJob of the job exceed the message limit. A digest is stored with every member too.
  for (const auto& [field, value] : {std::pair{"host", &args.host},
                                     {"device", &args.device},
                                     {"layout digest", &args.layout_digest}}) {
    if (value->size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(Who(args), ": ", field, " is ", value->size(),
                                                     " bytes, over ", kMaxNameBytes));
    }
  }
  if (absl::Status s = CheckPlanOptions(args.options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(Who(args), ": plan options: ", s.message()));
  }
  for (const v1::TensorSpec& t : args.layout) {
    if (!v1::DType_IsValid(t.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(args), ": tensor '", t.name().substr(0, 64), "' has unknown dtype ", t.dtype()));
    }
  }
  if (!args.layout.empty()) {
    google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(args.layout.begin(), args.layout.end());
    const std::string actual = plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
    if (actual != args.layout_digest) {
      return absl::InvalidArgumentError(absl::StrCat(Who(args), ": layout digest ",
                                                     args.layout_digest,
                                                     " does not match its layout (", actual, ")"));
    }
  }
  return absl::OkStatus();
}

JoinDecision DecideJoin(const JobAdmissionView& job, const JoinArgs& args) {
  if (job.forming) {
    return RefuseJoin{
        absl::UnavailableError(absl::StrCat("job ", args.job_id, " is storing its plan; retry"))};
  }
  if (job.live_members == 0) {
    // Whatever the job was, nobody holds it: this join re-forms it, and every rank is free.
    return AwaitFormation{.rank = args.rank < 0 ? 0 : args.rank, .reform = true};
  }
  if (std::optional<absl::Status> refused = Mismatch(job, args)) return RefuseJoin{*refused};
  if (args.rank >= 0) return DecideNamedRank(job, args);
  if (!job.lowest_free_rank.has_value()) {
    return RefuseJoin{
        absl::AlreadyExistsError(absl::StrCat("job ", args.job_id, " is full: ", job.live_members,
                                              " of ", job.world_size, " ranks are live"))};
  }
  return AwaitFormation{.rank = *job.lowest_free_rank};
}

}  // namespace zerod::server
