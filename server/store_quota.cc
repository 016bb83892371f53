#include "server/store_quota.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/join_admission.h"

namespace zerod::server {
namespace {

// "jobs/<job>/kv/<key>" as (job, key); nullopt for the daemon's own records.
std::optional<std::pair<std::string, std::string>> SplitStoreKey(const std::string& full_key) {
  constexpr size_t kJobs = 5;  // "jobs/"
  const size_t slash = full_key.find('/', kJobs);
  if (slash == std::string::npos || full_key.compare(slash + 1, 3, "kv/") != 0) return std::nullopt;
  return std::pair{full_key.substr(kJobs, slash - kJobs), full_key.substr(slash + 4)};
}

}  // namespace

StoreQuota::StoreQuota(KvStore* kv, int64_t max_keys_per_job, int64_t max_bytes_per_job)
    : kv_(kv), max_keys_(max_keys_per_job), max_bytes_(max_bytes_per_job) {
  {
    MutexLock lock(&mu_);
    for (const KeyValue& kv_pair : kv_->Range("jobs/")) Count(kv_pair.key, kv_pair.value);
  }
  watch_id_ =
      kv_->Watch("jobs/", [this](const std::vector<KvEvent>& events) { OnCommitted(events); });
}

StoreQuota::~StoreQuota() { kv_->Unwatch(watch_id_); }

void StoreQuota::Count(const std::string& full_key, const std::optional<std::string>& value) {
  auto split = SplitStoreKey(full_key);
  if (!split.has_value()) return;
  auto& [job_id, key] = *split;
  Usage& usage = jobs_[job_id];
  if (auto it = usage.sizes.find(key); it != usage.sizes.end()) {
    usage.bytes -= it->second;
    usage.sizes.erase(it);
  }
  if (value.has_value()) {
    const int64_t size = static_cast<int64_t>(key.size() + value->size());
    usage.sizes.emplace(key, size);
    usage.bytes += size;
  }
  ForgetIfEmpty(job_id);
}

void StoreQuota::ForgetIfEmpty(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const Usage& u = it->second;
  if (u.sizes.empty() && u.reserved_keys == 0 && u.reserved_bytes == 0) jobs_.erase(it);
}

void StoreQuota::OnCommitted(const std::vector<KvEvent>& events) {
  MutexLock lock(&mu_);
  for (const KvEvent& e : events) Count(e.key, e.value);
}

absl::StatusOr<StoreQuota::Reservation> StoreQuota::Reserve(const std::string& job_id,
                                                            const std::string& key,
                                                            int64_t value_bytes) {
  MutexLock lock(&mu_);
  Usage& usage = jobs_[job_id];
  auto existing = usage.sizes.find(key);
  Reservation r{job_id, existing == usage.sizes.end() ? 1 : 0,
                static_cast<int64_t>(key.size()) + value_bytes};
  const int64_t held_keys = static_cast<int64_t>(usage.sizes.size()) + usage.reserved_keys;
  const int64_t held_bytes = usage.bytes + usage.reserved_bytes;
  const int64_t replaced = existing == usage.sizes.end() ? 0 : existing->second;
  absl::Status refused;
  if (held_keys + r.keys > max_keys_) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("job ", job_id, ": the store holds ", held_keys, " keys, the most a job may (",
                     max_keys_, ", --max-store-keys); key '", ShownKey(key), "' was not written"));
  } else if (held_bytes - replaced + r.bytes > max_bytes_) {
    refused = absl::ResourceExhaustedError(
        absl::StrCat("job ", job_id, ": writing ", r.bytes, " bytes at key '", ShownKey(key),
                     "' would take the store past ", max_bytes_,
                     " bytes (--max-store-bytes); it holds ", held_bytes, "; nothing was written"));
  }
  if (!refused.ok()) {
    ForgetIfEmpty(job_id);
    return refused;
  }
  usage.reserved_keys += r.keys;
  usage.reserved_bytes += r.bytes;
  return r;
}

void StoreQuota::Release(const Reservation& r) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(r.job_id);
  if (it == jobs_.end()) return;
  it->second.reserved_keys -= r.keys;
  it->second.reserved_bytes -= r.bytes;
  ForgetIfEmpty(r.job_id);
}

int64_t StoreQuota::keys(const std::string& job_id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : static_cast<int64_t>(it->second.sizes.size());
}

int64_t StoreQuota::bytes(const std::string& job_id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.bytes;
}

}  // namespace zerod::server
