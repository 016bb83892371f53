// A job's records as read back from the KvStore at start-up (server/job_records.h): meta JSON,
// binary PlanInputs, member JSON, decoded by DecodeJob. The input is a list of (key, value) pairs
// (fuzz_records.h) whose keys are relative to the job's prefix ("meta", "plan", "members/0").
// A job that decodes is written back the way the daemon writes it and must decode again: a record
// the daemon writes that it cannot read would stop the next start.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/job.h"
#include "server/job_records.h"
#include "tests/fuzz/fuzz_records.h"
#include "tests/fuzz/quiet_logs.h"

namespace {

using zerod::server::KeyValue;

constexpr char kJobId[] = "fuzz";

std::vector<KeyValue> Reencode(zerod::server::Job& job) {
  zerod::MutexLock lock(&job.mu);
  std::vector<KeyValue> out;
  if (job.plan.has_value()) {
    for (zerod::server::KvOp& op : zerod::server::FormationRecords(job, *job.plan)) {
      if (op.kind == zerod::server::KvOp::Kind::kPut) out.push_back({op.key, op.value});
    }
    return out;
  }
  out.push_back(
      {zerod::server::MetaKey(job.id), zerod::server::EncodeMeta(job, job.generation, job.state)});
  for (const auto& [rank, member] : job.members) {
    out.push_back({zerod::server::MemberKey(job.id, rank), zerod::server::EncodeMember(member)});
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zerod::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  std::vector<KeyValue> records;
  while (in.remaining_bytes() > 0) {
    KeyValue kv;
    kv.key = zerod::server::JobPrefix(kJobId) + in.ConsumeRandomLengthString(64);
    kv.value = in.ConsumeRandomLengthString(zerod::fuzz::kMaxRecordBytes);
    records.push_back(std::move(kv));
  }
  const absl::Time lease_expiry = absl::UnixEpoch() + absl::Hours(1);
  auto job = zerod::server::DecodeJob(kJobId, records, lease_expiry);
  if (!job.ok()) return 0;
  auto again = zerod::server::DecodeJob(kJobId, Reencode(**job), lease_expiry);
  if (!again.ok()) {
    fprintf(stderr, "a decoded job, written back, does not decode: %s\n",
            std::string(again.status().message()).c_str());
    std::abort();
  }
  return 0;
}
