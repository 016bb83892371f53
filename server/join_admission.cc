#include "server/join_admission.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
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
  // Options first: a stage that differs also labels the layout differently (units at stage 3).
  if (job.options != nullptr) {
    if (std::optional<OptionDifference> d = FirstOptionDifference(*job.options, args.options)) {
      return absl::FailedPreconditionError(
          absl::StrCat(Who(args), " asked for ", d->name, " ", d->asked, "; rank ",
                       job.layout_digest_rank, " formed the job with ", d->name, " ", d->formed,
                       " (every rank must give the same options)"));
    }
  }
  if (args.layout_digest != job.layout_digest) {
    if (!job.layout.empty() && !args.layout.empty()) {
      if (std::optional<std::string> where = FirstLayoutDifference(
              job.layout, args.layout, job.layout_digest_rank,
              args.rank < 0 ? std::string("the joining rank") : absl::StrCat("rank ", args.rank))) {
        return absl::FailedPreconditionError(absl::StrCat("job ", args.job_id, ": ", *where));
      }
    }
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

std::string Quoted(const std::string& text) {
  return absl::StrCat("'", text.size() > 256 ? ShownKey(text) : text, "'");
}

// A tensor as a refusal shows it: 'name' [2, 3] fp32, and its unit when it has one.
std::string TensorText(const v1::TensorSpec& t) {
  std::string dtype = absl::AsciiStrToLower(v1::DType_Name(t.dtype()));
  if (absl::StartsWith(dtype, "dtype_")) dtype = dtype.substr(6);
  std::string text =
      absl::StrCat("'", ShownKey(t.name()), "' [", absl::StrJoin(t.shape(), ", "), "] ", dtype);
  if (!t.unit().empty()) absl::StrAppend(&text, " unit '", ShownKey(t.unit()), "'");
  return text;
}

}  // namespace

std::optional<OptionDifference> FirstOptionDifference(const v1::PlanOptions& formed,
                                                      const v1::PlanOptions& asked) {
  // Every field by reflection, so that a field added later is compared too; the agreed map
  // entry by entry, in name order.
  const google::protobuf::Descriptor* d = v1::PlanOptions::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_map()) continue;
    std::string a, b;
    google::protobuf::TextFormat::PrintFieldValueToString(asked, f, -1, &a);
    google::protobuf::TextFormat::PrintFieldValueToString(formed, f, -1, &b);
    if (a != b) return OptionDifference{f->name(), a, b};
  }
  std::map<std::string, std::pair<const std::string*, const std::string*>> agreed;
  for (const auto& [name, value] : asked.agreed()) agreed[name].first = &value;
  for (const auto& [name, value] : formed.agreed()) agreed[name].second = &value;
  for (const auto& [name, values] : agreed) {
    const auto& [a, b] = values;
    if (a != nullptr && b != nullptr && *a == *b) continue;
    return OptionDifference{name, a == nullptr ? "(none)" : Quoted(*a),
                            b == nullptr ? "(none)" : Quoted(*b)};
  }
  return std::nullopt;
}

std::optional<std::string> FirstLayoutDifference(absl::Span<const v1::TensorSpec> formed,
                                                 absl::Span<const v1::TensorSpec> asked,
                                                 int64_t formed_rank, const std::string& asker) {
  auto same = [](const v1::TensorSpec& a, const v1::TensorSpec& b) {
    return a.name() == b.name() && a.dtype() == b.dtype() && a.unit() == b.unit() &&
           std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end());
  };
  const size_t common = std::min(formed.size(), asked.size());
  for (size_t i = 0; i < common; ++i) {
    if (same(formed[i], asked[i])) continue;
    return absl::StrCat(asker, "'s layout differs from rank ", formed_rank, "'s at tensor ", i,
                        ": ", asker, " has ", TensorText(asked[i]), ", rank ", formed_rank, " has ",
                        TensorText(formed[i]));
  }
  if (formed.size() == asked.size()) return std::nullopt;
  const bool asker_longer = asked.size() > formed.size();
  return absl::StrCat(asker, " has ", asked.size(), " tensors, rank ", formed_rank, " has ",
                      formed.size(), ": tensor ", common, " ",
                      TensorText(asker_longer ? asked[common] : formed[common]), " is only in ",
                      asker_longer ? asker : absl::StrCat("rank ", formed_rank), "'s layout");
}

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
  if (o.agreed_size() > kMaxAgreedOptions) {
    return absl::InvalidArgumentError(
        absl::StrCat("agreed options: ", o.agreed_size(), " entries, over ", kMaxAgreedOptions));
  }
  for (const auto& [name, value] : o.agreed()) {
    if (name.size() > kMaxNameBytes || value.size() > kMaxAgreedValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("agreed option '", ShownKey(name), "' is ", name.size(), " + ", value.size(),
                       " bytes, over ", kMaxNameBytes, " + ", kMaxAgreedValueBytes));
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
