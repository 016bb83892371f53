#include "server/job_store.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/job_records.h"
#include "server/join_admission.h"

namespace zerod::server {
namespace {

// Barrier participants are keys under <job store>/__barrier/<name>/.
constexpr char kBarrierKeyPrefix[] = "__barrier/";
// The longest value Add stores: "-9223372036854775808".
constexpr int64_t kMaxIntegerBytes = 20;

std::string FullKey(const std::string& job_id, const std::string& key) {
  return StoreKeyPrefix(job_id) + key;
}

// The commit of one op, answered as `done` expects.
template <class T, class F>
KvStore::CommitCallback OneOp(JobStore::Done<T> done, F answer) {
  return [done = std::move(done), answer](absl::StatusOr<CommitResult> r) {
    if (!r.ok()) return done(r.status());
    done(answer(*r));
  };
}

}  // namespace

JobStore::JobStore(KvStore* kv, const Clock* clock, JobCheck job_check, StoreLimits limits)
    : kv_(kv),
      clock_(clock),
      job_check_(std::move(job_check)),
      limits_(limits),
      quota_(kv, limits.max_keys_per_job, limits.max_bytes_per_job),
      waits_(kv, clock, "jobs/") {}

JobStore::~JobStore() {
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return commits_in_flight_ == 0; });
}

void JobStore::Commit(std::vector<KvOp> ops, KvStore::CommitCallback done,
                      std::optional<StoreQuota::Reservation> reservation) {
  {
    MutexLock lock(&mu_);
    ++commits_in_flight_;
  }
  kv_->Commit(std::move(ops), [this, done = std::move(done), reservation = std::move(reservation)](
                                  absl::StatusOr<CommitResult> r) {
    // Before answering: a caller that writes again at once finds the room given back.
    if (reservation.has_value()) quota_.Release(*reservation);
    done(std::move(r));
    // Last: once the count drops, the destructor may run.
    MutexLock lock(&mu_);
    --commits_in_flight_;
  });
}

absl::Status JobStore::CheckJobAndKey(const std::string& job_id, const std::string& key) const {
  if (absl::Status s = job_check_(job_id); !s.ok()) return s;
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": empty key"));
  if (static_cast<int64_t>(key.size()) > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": key '", key.substr(0, 32),
                                                   "...' is ", key.size(), " bytes, over ",
                                                   limits_.max_key_bytes, " (--max-key-bytes)"));
  }
  return absl::OkStatus();
}

absl::Time JobStore::Deadline(const WaitLimit& limit) const {
  const absl::Duration timeout =
      std::clamp(limit.timeout, absl::ZeroDuration(), limits_.longest_wait);
  return std::min(clock_->Now() + timeout, limit.call_deadline);
}

absl::Status JobStore::CheckValue(const std::string& job_id, const std::string& key,
                                  const std::string& value) const {
  if (static_cast<int64_t>(value.size()) > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", job_id, ": value for key '", ShownKey(key), "' is ", value.size(),
                     " bytes, over the limit of ", limits_.max_value_bytes, " (--max-value)"));
  }
  return absl::OkStatus();
}

void JobStore::Set(const std::string& job_id, const std::string& key, std::string value,
                   Done<int64_t> done) {
  if (absl::Status s = CheckJobAndKey(job_id, key); !s.ok()) return done(s);
  if (absl::Status s = CheckValue(job_id, key, value); !s.ok()) return done(s);
  auto room = quota_.Reserve(job_id, key, static_cast<int64_t>(value.size()));
  if (!room.ok()) return done(room.status());
  Commit({KvOp::Put(FullKey(job_id, key), std::move(value))},
         OneOp<int64_t>(std::move(done), [](const CommitResult& r) { return r.revision; }),
         *std::move(room));
}

void JobStore::Get(const std::string& job_id, const std::string& key, WaitLimit limit,
                   Done<KeyValue> done) {
  if (absl::Status s = CheckJobAndKey(job_id, key); !s.ok()) return done(s);
  const std::string full_key = FullKey(job_id, key);
  if (std::optional<KeyValue> kv = kv_->Get(full_key); kv.has_value()) return done(*std::move(kv));
  if (limit.timeout <= absl::ZeroDuration()) {
    return done(absl::NotFoundError(
        absl::StrCat("job ", job_id, ": key '", ShownKey(key), "' is not set")));
  }
  // The wait the message names is the one that ran (capped, or ended by the call's deadline),
  // not what was asked for ("within 4611686018427387904 ms").
  const absl::Time deadline = Deadline(limit);
  auto waiter = std::make_shared<StoreWaiter>([this, done = std::move(done), full_key, job_id, key,
                                               waited = deadline - clock_->Now()](absl::Status s) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      return done(absl::DeadlineExceededError(
          absl::StrCat("job ", job_id, ": key '", ShownKey(key), "' was not set within ",
                       absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))))));
    }
    if (!s.ok()) return done(s);
    std::optional<KeyValue> kv = kv_->Get(full_key);
    if (!kv.has_value()) {
      return done(absl::NotFoundError(absl::StrCat("job ", job_id, ": key '", ShownKey(key),
                                                   "' was deleted right after it was set")));
    }
    done(*std::move(kv));
  });
  waits_.AwaitKeys(waiter, {full_key}, deadline);
}

void JobStore::Add(const std::string& job_id, const std::string& key, int64_t delta,
                   Done<int64_t> done) {
  if (absl::Status s = CheckJobAndKey(job_id, key); !s.ok()) return done(s);
  auto room = quota_.Reserve(job_id, key, kMaxIntegerBytes);
  if (!room.ok()) return done(room.status());
  Commit(
      {KvOp::Add(FullKey(job_id, key), delta)},
      [done = std::move(done), job_id, key](absl::StatusOr<CommitResult> r) {
        if (!r.ok()) {
          // The KvStore names the key as stored (jobs/<job>/kv/<key>); the caller knows `key`.
          const std::string message = absl::StrReplaceAll(
              r.status().message(), {{absl::StrCat("'", FullKey(job_id, key), "'"),
                                      absl::StrCat("'", ShownKey(key), "'")}});
          return done(absl::Status(r.status().code(), absl::StrCat("job ", job_id, ": ", message)));
        }
        int64_t value = 0;
        // The store wrote this text from an integer.
        (void)absl::SimpleAtoi(r->results[0].value.value_or("0"), &value);
        done(value);
      },
      *std::move(room));
}

void JobStore::CompareSet(const std::string& job_id, const std::string& key,
                          std::optional<std::string> expected, std::string desired,
                          Done<CompareSetResult> done) {
  if (absl::Status s = CheckJobAndKey(job_id, key); !s.ok()) return done(s);
  // The value limit holds for every write: CompareSet stored 30 MiB once, past Set's check.
  if (absl::Status s = CheckValue(job_id, key, desired); !s.ok()) return done(s);
  auto room = quota_.Reserve(job_id, key, static_cast<int64_t>(desired.size()));
  if (!room.ok()) return done(room.status());
  Commit({KvOp::CompareAndSwap(FullKey(job_id, key), std::move(expected), std::move(desired))},
         OneOp<CompareSetResult>(
             std::move(done),
             [](const CommitResult& r) {
               return CompareSetResult{r.results[0].applied, r.results[0].value.value_or("")};
             }),
         *std::move(room));
}

void JobStore::Delete(const std::string& job_id, const std::string& key, Done<bool> done) {
  if (absl::Status s = CheckJobAndKey(job_id, key); !s.ok()) return done(s);
  Commit({KvOp::Delete(FullKey(job_id, key))},
         OneOp<bool>(std::move(done), [](const CommitResult& r) { return r.results[0].applied; }));
}

void JobStore::Wait(const std::string& job_id, const std::vector<std::string>& keys,
                    WaitLimit limit, std::function<void(absl::Status)> done) {
  // More keys than a job's Store may hold can never all exist; each one waited for takes memory.
  if (static_cast<int64_t>(keys.size()) > limits_.max_keys_per_job) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("job ", ShownJobId(job_id), ": a wait for ", keys.size(),
                     " keys, more than a job's store may hold (", limits_.max_keys_per_job,
                     ", --max-store-keys)")));
  }
  std::vector<std::string> full_keys;
  for (const std::string& k : keys) {
    if (absl::Status s = CheckJobAndKey(job_id, k); !s.ok()) return done(s);
    full_keys.push_back(FullKey(job_id, k));
  }
  const std::string prefix = StoreKeyPrefix(job_id);
  auto waiter =
      std::make_shared<StoreWaiter>([done = std::move(done), job_id, prefix](absl::Status s) {
        if (s.code() == absl::StatusCode::kDeadlineExceeded) {
          // Name the keys as the caller knows them.
          std::string message(s.message());
          for (size_t at; (at = message.find(prefix)) != std::string::npos;) {
            message.erase(at, prefix.size());
          }
          s = absl::DeadlineExceededError(absl::StrCat("job ", job_id, ": ", message));
        }
        done(s);
      });
  waits_.AwaitKeys(waiter, full_keys, Deadline(limit));
}

void JobStore::Barrier(const std::string& job_id, const std::string& name, int64_t participant,
                       int64_t count, WaitLimit limit, std::function<void(absl::Status)> done) {
  if (absl::Status s = CheckJobAndKey(job_id, name); !s.ok()) return done(s);
  if (count < 1 || name.find('/') != std::string::npos) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": barrier '", ShownKey(name),
                     "' needs a count >= 1 and a name without '/', got count ", count)));
  }
  // Every participant is a key of the job's Store.
  if (count > limits_.max_keys_per_job) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": barrier '", ShownKey(name), "' of ", count,
                     " participants can never complete: a job's store holds at most ",
                     limits_.max_keys_per_job, " keys (--max-store-keys)")));
  }
  const std::string prefix = FullKey(job_id, absl::StrCat(kBarrierKeyPrefix, name, "/"));
  const std::string arrival = absl::StrCat(kBarrierKeyPrefix, name, "/", participant);
  auto room = quota_.Reserve(job_id, arrival, 1);
  if (!room.ok()) return done(room.status());
  auto waiter =
      std::make_shared<StoreWaiter>([done = std::move(done), job_id, name, count](absl::Status s) {
        if (s.code() == absl::StatusCode::kDeadlineExceeded) {
          s = absl::DeadlineExceededError(absl::StrCat("job ", job_id, ": barrier '",
                                                       ShownKey(name), "' did not reach ", count,
                                                       " participants in time"));
        }
        done(s);
      });
  // Arrive first, then wait: the participants counted then include this one.
  Commit(
      {KvOp::Put(prefix + absl::StrCat(participant), "1")},
      [this, waiter, prefix, count, deadline = Deadline(limit)](absl::StatusOr<CommitResult> r) {
        if (!r.ok()) return waiter->Complete(r.status());
        waits_.AwaitBarrier(waiter, prefix, count, deadline);
      },
      *std::move(room));
}

}  // namespace zerod::server
