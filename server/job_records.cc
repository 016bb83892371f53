#include "server/job_records.h"

#include <google/protobuf/util/json_util.h>

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
  for (int64_t r = 0; r < job.world_size; ++r) {
    const std::optional<Member>& m = job.members[static_cast<size_t>(r)];
    if (!m.has_value()) continue;
    Member stored = *m;
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
      job->world_size = j.at("world_size").get<int64_t>();
      job->generation = j.at("generation").get<int64_t>();
      job->state = static_cast<v1::JobState>(j.at("state").get<int>());
      job->layout_digest = j.at("layout_digest").get<std::string>();
      job->layout_digest_rank = j.at("layout_digest_rank").get<int64_t>();
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
    job->members.resize(static_cast<size_t>(job->world_size));
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
        m.state = static_cast<v1::MemberState>(j.at("state").get<int>());
        m.host = j.at("host").get<std::string>();
        m.device = j.at("device").get<std::string>();
        m.budget_bytes = j.at("budget_bytes").get<int64_t>();
        m.layout_digest = j.at("layout_digest").get<std::string>();
        m.generation = j.at("generation").get<int64_t>();
        if (m.state == v1::MEMBER_ACTIVE) m.lease_expiry = lease_expiry;
        job->members[static_cast<size_t>(rank)] = std::move(m);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("job ", job_id, ": corrupt record: ", e.what()));
  }
  // Joins are never stored, so every rank recorded was taken: active ones still hold it, lost
  // ones wait for a replacement, and the rest are free again.
  job->slots.Reset(job->world_size);
  for (int64_t r = 0; r < job->world_size; ++r) {
    const auto& m = job->members[static_cast<size_t>(r)];
    if (!m.has_value()) continue;
    job->slots.Take(r);
    if (m->state == v1::MEMBER_LOST) {
      job->slots.MarkLost(r);
    } else if (m->state != v1::MEMBER_ACTIVE) {
      job->slots.Free(r);
    }
  }
  return job;
}

}  // namespace zerod::server
