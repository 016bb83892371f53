#include "server/job_records.h"

#include <google/protobuf/util/json_util.h>

#include <limits>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "proto/plan_convert.h"

namespace zerod::server {

std::string JobPrefix(const std::string& job_id) { return absl::StrCat("jobs/", job_id, "/"); }
std::string MetaKey(const std::string& job_id) { return JobPrefix(job_id) + "meta"; }
std::string PlanKey(const std::string& job_id) { return JobPrefix(job_id) + "plan"; }
std::string MembersPrefix(const std::string& job_id) { return JobPrefix(job_id) + "members/"; }
std::string MemberKey(const std::string& job_id, int64_t rank) {
  return absl::StrFormat("%s%09d", MembersPrefix(job_id), rank);
}
std::string StoreKeyPrefix(const std::string& job_id) { return JobPrefix(job_id) + "kv/"; }

namespace {

// A stored field that is not an integer int64 holds: damage to report, never a value to convert
// (get<int64_t>() of a stored 1e62 is undefined behaviour).
struct NotAnInteger : std::runtime_error {
  explicit NotAnInteger(const std::string& field)
      : std::runtime_error(absl::StrCat("'", field, "' is not an integer in range")) {}
};

int64_t IntegerField(const nlohmann::json& j, const char* field) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() &&
       v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    throw NotAnInteger(field);
  }
  return v.get<int64_t>();
}

// An enum's number as stored; one past int's range is -1, which no state is.
int StateNumber(int64_t stored) {
  return stored < std::numeric_limits<int>::min() || stored > std::numeric_limits<int>::max()
             ? -1
             : static_cast<int>(stored);
}

constexpr char kJobsPrefix[] = "jobs/";
constexpr char kQuarantinePrefix[] = "quarantine/";
constexpr char kReasonRecord[] = "reason";

}  // namespace

std::string JobOfKey(const std::string& key) {
  if (!absl::StartsWith(key, kJobsPrefix)) return "";
  const size_t begin = sizeof kJobsPrefix - 1;
  const size_t end = key.find('/', begin);
  return end == std::string::npos ? "" : key.substr(begin, end - begin);
}

std::pair<std::vector<KvOp>, std::string> QuarantineRecords(
    const std::string& job_id, const std::vector<KeyValue>& intact,
    const std::vector<DamagedRecord>& damaged, int64_t revision, const std::string& reason) {
  const std::string from = JobPrefix(job_id);
  const std::string to = absl::StrCat(kQuarantinePrefix, job_id, "/r", revision, "/");
  std::vector<KvOp> ops;
  for (const KeyValue& kv : intact) {
    ops.push_back(KvOp::Put(to + kv.key.substr(from.size()), kv.value));
  }
  for (const DamagedRecord& d : damaged) {
    ops.push_back(KvOp::Put(to + d.key.substr(from.size()), d.value));
  }
  ops.push_back(KvOp::Put(to + kReasonRecord, reason));
  ops.push_back(KvOp::DeletePrefix(from));
  return {std::move(ops), to};
}

std::map<std::string, std::string> QuarantinedJobs(const std::vector<KeyValue>& records) {
  std::map<std::string, std::pair<int64_t, std::string>> latest;
  for (const KeyValue& kv : records) {
    // quarantine/<job>/r<revision>/reason
    const std::string tail = absl::StrCat("/", kReasonRecord);
    if (!absl::StartsWith(kv.key, kQuarantinePrefix) || !absl::EndsWith(kv.key, tail)) continue;
    const std::string rest = kv.key.substr(sizeof kQuarantinePrefix - 1);
    const size_t slash = rest.find('/');
    if (slash == std::string::npos || slash + 1 + tail.size() >= rest.size()) continue;
    const std::string tag = rest.substr(slash + 1, rest.size() - slash - 1 - tail.size());
    int64_t revision = 0;
    if (tag[0] != 'r' || !absl::SimpleAtoi(tag.substr(1), &revision)) continue;
    auto& [newest, why] = latest[rest.substr(0, slash)];
    if (revision < newest) continue;
    newest = revision;
    why = absl::StrCat(kv.value, "; its records are kept under ",
                       kv.key.substr(0, kv.key.size() - sizeof kReasonRecord + 1));
  }
  std::map<std::string, std::string> out;
  for (auto& [job, entry] : latest) out[job] = std::move(entry.second);
  return out;
}

std::string EncodeMeta(const Job& job, int64_t generation, v1::JobState state) {
  std::string options;
  (void)google::protobuf::util::MessageToJsonString(job.options, &options);
  nlohmann::json j = {{"world_size", job.world_size},
                      {"generation", generation},
                      {"state", static_cast<int>(state)},
                      {"layout_digest", job.layout_digest},
                      {"layout_digest_rank", job.layout_digest_rank},
                      {"options", options}};
  return j.dump();
}

std::string EncodeMember(const Member& m) {
  nlohmann::json j = {{"state", static_cast<int>(m.state)},
                      {"host", m.host},
                      {"device", m.device},
                      {"budget_bytes", m.budget_bytes},
                      {"layout_digest", m.layout_digest},
                      {"generation", m.generation}};
  return j.dump();
}

std::vector<KvOp> FormationRecords(const Job& job, const v1::PlanInputs& inputs) {
  std::vector<KvOp> ops;
  ops.push_back(KvOp::Put(MetaKey(job.id), EncodeMeta(job, inputs.generation(), v1::JOB_RUNNING)));
  ops.push_back(KvOp::Put(PlanKey(job.id), inputs.SerializeAsString()));
  ops.push_back(KvOp::DeletePrefix(MembersPrefix(job.id)));
  for (const auto& [r, m] : job.members) {
    Member stored = m;
    if (stored.state == v1::MEMBER_JOINING) {
      stored.state = v1::MEMBER_ACTIVE;
      stored.generation = inputs.generation();
    }
    ops.push_back(KvOp::Put(MemberKey(job.id, r), EncodeMember(stored)));
  }
  return ops;
}

absl::StatusOr<std::shared_ptr<Job>> DecodeJob(const std::string& job_id,
                                               const std::vector<KeyValue>& records,
                                               absl::Time lease_expiry) {
  auto job = std::make_shared<Job>(job_id);
  MutexLock lock(&job->mu);
  const std::string meta_key = MetaKey(job_id);
  const std::string plan_key = PlanKey(job_id);
  const std::string members = MembersPrefix(job_id);
  bool have_meta = false;
  try {
    for (const KeyValue& kv : records) {
      if (kv.key != meta_key) continue;
      const nlohmann::json j = nlohmann::json::parse(kv.value);
      job->world_size = IntegerField(j, "world_size");
      job->generation = IntegerField(j, "generation");
      const int64_t state = IntegerField(j, "state");
      if (!v1::JobState_IsValid(StateNumber(state))) {
        return absl::DataLossError(absl::StrCat(meta_key, ": job state ", state, " is unknown"));
      }
      job->state = static_cast<v1::JobState>(StateNumber(state));
      job->layout_digest = j.at("layout_digest").get<std::string>();
      job->layout_digest_rank = IntegerField(j, "layout_digest_rank");
      if (!google::protobuf::util::JsonStringToMessage(j.at("options").get<std::string>(),
                                                       &job->options)
               .ok()) {
        return absl::DataLossError(absl::StrCat(meta_key, ": options do not parse"));
      }
      have_meta = true;
    }
    if (!have_meta) return absl::DataLossError(absl::StrCat("job ", job_id, " has no meta record"));
    if (job->world_size < 0 || job->world_size > (int64_t{1} << 24)) {
      return absl::DataLossError(
          absl::StrCat(meta_key, ": world size ", job->world_size, " is out of range"));
    }
    for (const KeyValue& kv : records) {
      if (kv.key == plan_key) {
        v1::PlanInputs inputs;
        if (!inputs.ParseFromString(kv.value)) {
          return absl::DataLossError(absl::StrCat(plan_key, ": does not parse"));
        }
        auto plan = rpc::PlanFromInputs(inputs);
        if (!plan.ok())
          return absl::DataLossError(absl::StrCat(plan_key, ": ", plan.status().message()));
        job->layout.assign(inputs.tensors().begin(), inputs.tensors().end());
        job->shard_plan = std::make_shared<const plan::ShardPlan>(*std::move(plan));
        job->plan_bytes = std::make_shared<const std::string>(kv.value);
        job->plan = std::move(inputs);
      } else if (absl::StartsWith(kv.key, members)) {
        int64_t rank = 0;
        if (!absl::SimpleAtoi(kv.key.substr(members.size()), &rank) || rank < 0 ||
            rank >= job->world_size) {
          return absl::DataLossError(absl::StrCat(kv.key, ": bad rank"));
        }
        const nlohmann::json j = nlohmann::json::parse(kv.value);
        Member m;
        const int64_t state = IntegerField(j, "state");
        if (!v1::MemberState_IsValid(StateNumber(state))) {
          return absl::DataLossError(absl::StrCat(kv.key, ": member state ", state, " is unknown"));
        }
        m.state = static_cast<v1::MemberState>(StateNumber(state));
        m.host = j.at("host").get<std::string>();
        m.device = j.at("device").get<std::string>();
        m.budget_bytes = IntegerField(j, "budget_bytes");
        m.layout_digest = j.at("layout_digest").get<std::string>();
        m.generation = IntegerField(j, "generation");
        if (m.state == v1::MEMBER_ACTIVE) m.lease_expiry = lease_expiry;
        job->members[rank] = std::move(m);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("job ", job_id, ": corrupt record: ", e.what()));
  } catch (const NotAnInteger& e) {
    return absl::DataLossError(absl::StrCat("job ", job_id, ": corrupt record: ", e.what()));
  }
  // Joins are never stored, so every rank recorded was taken: active ones still hold it, lost
  // ones wait for a replacement, and the rest are free again.
  job->slots.Reset(job->world_size);
  for (const auto& [r, m] : job->members) {
    job->slots.Take(r);
    if (m.state == v1::MEMBER_LOST) {
      job->slots.MarkLost(r);
    } else if (m.state != v1::MEMBER_ACTIVE) {
      job->slots.Free(r);
    }
  }
  return job;
}

}  // namespace zerod::server
