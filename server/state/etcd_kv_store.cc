#include "server/state/etcd_kv_store.h"

#include <algorithm>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/logging.h"
#include "server/state/etcd_claim.h"
#include "server/state/internal/etcd_client.h"
#include "server/state/internal/etcd_txn.h"

namespace zerod::server {

using internal::EtcdClient;
using internal::IsTransient;
using internal::PrefixEnd;

namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

std::string RandomId() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16));
}

KeyValue FromEtcd(const mvccpb::KeyValue& kv, size_t prefix_size) {
  return {kv.key().substr(prefix_size), kv.value(), kv.create_revision(), kv.mod_revision(),
          kv.version()};
}

}  // namespace

std::string CommitMarkerPrefix(const std::string& prefix) {
  return KeyBesidePrefix(prefix, ".commit/");
}

absl::StatusOr<EtcdOptions> ParseEtcdUrl(std::string_view url_view) {
  const std::string url(url_view);
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd URL '", url, "' does not start with etcd://"));
  }
  absl::string_view rest = absl::string_view(url).substr(kScheme.size());
  EtcdOptions options;
  const size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    options.prefix = std::string(rest.substr(slash));
    if (options.prefix.back() != '/') options.prefix += '/';
    if (absl::StrContains(options.prefix, "//")) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd URL '", url, "': prefix '", options.prefix, "' has an empty part"));
    }
    rest = rest.substr(0, slash);
  }
  for (absl::string_view endpoint : absl::StrSplit(rest, ',')) {
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("etcd URL '", url, "': endpoint '", endpoint,
                                                     "' is not host:port (port 1-65535)"));
    }
    options.endpoints.emplace_back(endpoint);
  }
  return options;
}

absl::StatusOr<std::unique_ptr<EtcdKvStore>> EtcdKvStore::Open(const EtcdOptions& options) {
  if (options.prefix.empty() || options.prefix[0] == '\0') {
    return absl::InvalidArgumentError("etcd prefix must be non-empty and not start with \\0");
  }
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  if (!client.ok()) return client.status();
  if (!(*client)->WaitForConnected(options.request_timeout)) {
    return absl::UnavailableError(absl::StrCat((*client)->where(), ": no member answered within ",
                                               absl::FormatDuration(options.request_timeout)));
  }
  std::unique_ptr<EtcdKvStore> store(new EtcdKvStore(options, *std::move(client)));
  if (absl::Status loaded = store->Reload(/*tell_watchers=*/false); !loaded.ok()) {
    // No answer in time (or no leader) is etcd being unavailable, whatever the call's own code.
    const bool unanswered = absl::IsDeadlineExceeded(loaded) || absl::IsResourceExhausted(loaded) ||
                            absl::IsAborted(loaded);
    return unanswered ? absl::UnavailableError(loaded.message()) : loaded;
  }
  store->Start();
  return store;
}

EtcdKvStore::EtcdKvStore(EtcdOptions options, std::unique_ptr<internal::EtcdClient> client)
    : options_(std::move(options)),
      client_(std::move(client)),
      marker_key_(CommitMarkerPrefix(options_.prefix) + RandomId()) {}

void EtcdKvStore::Start() {
  committer_ = std::thread([this] { CommitterLoop(); });
  watcher_ = std::thread([this] { WatchLoop(); });
  callbacks_ = std::thread([this] { CallbackLoop(); });
}

EtcdKvStore::~EtcdKvStore() {
  // Commits still queued run while etcd answers; their retries stop (CANCELLED) once it does not.
  {
    MutexLock lock(&queue_mu_);
    queue_stopping_ = true;
  }
  if (committer_.joinable()) committer_.join();
  {
    // Their `done` waits for the watch to bring their revisions, for a while.
    MutexLock lock(&mu_);
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return applied_.empty(); },
                         options_.request_timeout);
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (watcher_.joinable()) watcher_.join();
  if (callbacks_.joinable()) callbacks_.join();
  // The marker is only needed while this store commits.
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(marker_key_);
  etcdserverpb::TxnRequest txn;
  *txn.add_success()->mutable_request_delete_range() = request;
  etcdserverpb::TxnResponse response;
  (void)client_->Txn(txn, &response);
}

std::string EtcdKvStore::Where() const { return client_->where(); }

std::optional<KeyValue> EtcdKvStore::Get(const std::string& key) const {
  MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

std::vector<KeyValue> EtcdKvStore::Range(const std::string& prefix) const {
  MutexLock lock(&mu_);
  return RangeOfMirror(data_, prefix);
}

int64_t EtcdKvStore::revision() const {
  MutexLock lock(&mu_);
  return revision_;
}

std::vector<DamagedRecord> EtcdKvStore::Damaged(const std::string&) const { return {}; }

int64_t EtcdKvStore::Watch(const std::string& prefix, WatchCallback callback) {
  return watchers_.Add(prefix, std::move(callback));
}

void EtcdKvStore::Unwatch(int64_t id) { watchers_.Remove(id); }

void EtcdKvStore::Commit(std::vector<KvOp> ops, CommitCallback done) {
  MutexLock lock(&queue_mu_);
  queue_.push_back({std::move(ops), std::move(done)});
}

// --- the mirror ---------------------------------------------------------------------------------

absl::Status EtcdKvStore::Reload(bool tell_watchers) {
  etcdserverpb::RangeRequest request;
  request.set_key(options_.prefix);
  request.set_range_end(PrefixEnd(options_.prefix));
  etcdserverpb::RangeResponse response;
  if (grpc::Status s = client_->Range(request, &response); !s.ok()) {
    return client_->Error(s, "reading the state under " + options_.prefix);
  }
  std::map<std::string, KeyValue> fresh;
  for (const mvccpb::KeyValue& kv : response.kvs()) {
    KeyValue mine = FromEtcd(kv, options_.prefix.size());
    std::string key = mine.key;
    fresh.emplace(std::move(key), std::move(mine));
  }
  const int64_t revision = response.header().revision();
  MutexLock lock(&mu_);
  // What changed while the watch was away, as events in revision order (a deletion at the
  // revision read: when it happened is gone with the compacted history).
  std::vector<KvEvent> events;
  for (const auto& [key, kv] : data_) {
    if (fresh.count(key) == 0) events.push_back({key, std::nullopt, revision});
  }
  for (const auto& [key, kv] : fresh) {
    auto it = data_.find(key);
    if (it == data_.end() || it->second.mod_revision != kv.mod_revision) {
      events.push_back({key, kv.value, kv.mod_revision});
    }
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const KvEvent& a, const KvEvent& b) { return a.revision < b.revision; });
  data_ = std::move(fresh);
  revision_ = std::max(revision_, revision);
  if (tell_watchers && !events.empty()) to_deliver_.push_back(std::move(events));
  return absl::OkStatus();
}

void EtcdKvStore::ApplyEvents(const etcdserverpb::WatchResponse& response) {
  std::vector<KvEvent> events;
  MutexLock lock(&mu_);
  for (const mvccpb::Event& event : response.events()) {
    KeyValue kv = FromEtcd(event.kv(), options_.prefix.size());
    revision_ = std::max(revision_, kv.mod_revision);
    if (event.type() == mvccpb::Event::DELETE) {
      data_.erase(kv.key);
      events.push_back({kv.key, std::nullopt, kv.mod_revision});
    } else {
      events.push_back({kv.key, kv.value, kv.mod_revision});
      std::string key = kv.key;
      data_[std::move(key)] = std::move(kv);
    }
  }
  if (!events.empty()) to_deliver_.push_back(std::move(events));
}

void EtcdKvStore::WatchLoop() {
  int64_t next = revision() + 1;
  absl::Duration backoff = kFirstBackoff;
  for (;;) {
    absl::StatusOr<int64_t> ended = WatchFrom(next);
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (ended.ok()) {
      if (*ended > next) backoff = kFirstBackoff;  // it brought something
      next = std::max(next, *ended);
    } else if (absl::IsOutOfRange(ended.status())) {
      // etcd compacted past `next`: start over from a fresh Range.
      Logger("state")->warn("{}: watch fell behind compaction ({}); reloading", Where(),
                            std::string(ended.status().message()));
      if (absl::Status s = Reload(/*tell_watchers=*/true); s.ok()) {
        next = revision() + 1;
        continue;
      }
    }
    MutexLock lock(&mu_);
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                         backoff);
    if (stopping_) return;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::StatusOr<int64_t> EtcdKvStore::WatchFrom(int64_t start_revision) {
  grpc::ClientContext context;
  {
    MutexLock lock(&mu_);
    if (stopping_) return start_revision;
    watch_context_ = &context;
  }
  int64_t next = start_revision;
  absl::Status outcome = absl::OkStatus();
  auto stream = client_->Watch(&context);
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(options_.prefix);
  create->set_range_end(PrefixEnd(options_.prefix));
  create->set_start_revision(start_revision);
  if (stream->Write(request)) {
    etcdserverpb::WatchResponse response;
    while (stream->Read(&response)) {
      if (response.compact_revision() > 0) {
        outcome = absl::OutOfRangeError(
            absl::StrCat("compacted to ", response.compact_revision(), ", wanted ", next));
        break;
      }
      if (response.canceled()) {
        outcome =
            absl::UnavailableError(absl::StrCat("watch canceled: ", response.cancel_reason()));
        break;
      }
      if (response.events_size() > 0) {
        ApplyEvents(response);
        next = response.events(response.events_size() - 1).kv().mod_revision() + 1;
      }
    }
  }
  context.TryCancel();
  stream->WritesDone();
  const grpc::Status finished = stream->Finish();
  {
    MutexLock lock(&mu_);
    watch_context_ = nullptr;
  }
  if (!outcome.ok()) return outcome;
  (void)finished;  // every end of a stream is retried the same way
  return next;
}

void EtcdKvStore::CallbackLoop() {
  for (;;) {
    std::vector<std::vector<KvEvent>> deliveries;
    std::vector<Applied> ready;
    bool stop = false;
    {
      MutexLock lock(&mu_);
      mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !to_deliver_.empty() ||
               (!applied_.empty() && applied_.front().revision <= revision_);
      });
      for (auto& events : to_deliver_) deliveries.push_back(std::move(events));
      to_deliver_.clear();
      // Once stopping, commits whose revision the watch never brought are reported anyway:
      // etcd applied them.
      while (!applied_.empty() && (stopping_ || applied_.front().revision <= revision_)) {
        ready.push_back(std::move(applied_.front()));
        applied_.pop_front();
      }
      stop = stopping_;
    }
    for (const std::vector<KvEvent>& events : deliveries) watchers_.Deliver(events);
    for (Applied& a : ready) a.done(std::move(a.result));
    if (stop) return;
  }
}

// --- commits ------------------------------------------------------------------------------------

void EtcdKvStore::CommitterLoop() {
  for (;;) {
    std::vector<Pending> group;
    {
      MutexLock lock(&queue_mu_);
      queue_mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return queue_stopping_ || !queue_.empty();
      });
      if (queue_.empty()) return;
      group = TakeGroup();
    }
    std::vector<Applied> applied = RunGroup(group);
    MutexLock lock(&mu_);
    for (Applied& a : applied) applied_.push_back(std::move(a));
  }
}

std::vector<EtcdKvStore::Pending> EtcdKvStore::TakeGroup() {
  // The front commit always goes (alone if it is over the bounds: etcd then judges it); those
  // queued behind it join while the group stays within etcd's limits on one Txn (--max-txn-ops,
  // leaving a quarter for the reads' conditions, the marker and the fence; 1 MiB, under
  // --max-request-bytes' default 1.5 MiB).
  const size_t group_ops = static_cast<size_t>(std::max<int64_t>(1, options_.max_txn_ops * 3 / 4));
  constexpr size_t kGroupBytes = size_t{1} << 20;
  // Each op's key may appear twice in the Txn (a compare and a write), under the prefix; a group
  // that still ends up over etcd's limits (a prefix deleted, then written under, is deleted key
  // by key) is refused INVALID_ARGUMENT and split, see RunGroup.
  auto bytes_of = [this](const Pending& p) {
    size_t bytes = 0;
    for (const KvOp& op : p.ops) {
      bytes += 2 * (options_.prefix.size() + op.key.size()) + op.value.size() + 32;
    }
    return bytes;
  };
  std::vector<Pending> group;
  size_t ops = 0, bytes = 0;
  while (!queue_.empty()) {
    const Pending& next = queue_.front();
    const size_t next_bytes = bytes_of(next);
    if (!group.empty() && (ops + next.ops.size() > group_ops || bytes + next_bytes > kGroupBytes)) {
      break;
    }
    ops += next.ops.size();
    bytes += next_bytes;
    group.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return group;
}

std::vector<EtcdKvStore::Applied> EtcdKvStore::RunGroup(std::vector<Pending>& group) {
  std::vector<Applied> applied;
  auto alone = [&](Pending& p) {
    int64_t event_revision = 0;
    bool reply_lost = false;
    absl::StatusOr<CommitResult> result = RunCommit(p.ops, &event_revision, &reply_lost);
    applied.push_back({event_revision, std::move(result), std::move(p.done)});
  };
  if (group.size() == 1) {
    alone(group[0]);
    return applied;
  }
  // One Txn for the whole group: its ops in commit order over one staged state give each commit
  // the results it would have had alone, and every commit of the group lands at one revision.
  std::vector<KvOp> ops;
  for (const Pending& p : group) ops.insert(ops.end(), p.ops.begin(), p.ops.end());
  int64_t event_revision = 0;
  bool reply_lost = false;
  absl::StatusOr<CommitResult> together = RunCommit(ops, &event_revision, &reply_lost);
  const absl::StatusCode code = together.status().code();
  if (!reply_lost &&
      (code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kOutOfRange ||
       code == absl::StatusCode::kInvalidArgument)) {
    // One commit's own failure (an add on a non-integer, an overflow, a Txn over etcd's limits)
    // or the fence, and nothing was written: each commit alone, so that only its own fails.
    // Never once an attempt's reply was lost (UNAVAILABLE above all): the group may have
    // landed, and the marker knows it only as one commit.
    for (Pending& p : group) alone(p);
    return applied;
  }
  size_t offset = 0;
  for (Pending& p : group) {
    if (!together.ok()) {
      applied.push_back({event_revision, together.status(), std::move(p.done)});
      continue;
    }
    CommitResult mine;
    mine.revision = together->revision;
    const auto first = together->results.begin() + static_cast<ptrdiff_t>(offset);
    mine.results.assign(first, first + static_cast<ptrdiff_t>(p.ops.size()));
    offset += p.ops.size();
    applied.push_back({event_revision, std::move(mine), std::move(p.done)});
  }
  return applied;
}

bool EtcdKvStore::StillTrying(const std::string& failure, bool uncertain, absl::Status* gave_up) {
  const absl::Time now = absl::Now();
  if (unavailable_since_ == absl::InfiniteFuture()) unavailable_since_ = now;
  bool stopping;
  {
    MutexLock lock(&queue_mu_);
    stopping = queue_stopping_;
  }
  const std::string outcome = uncertain ? "whether the transaction was applied is unknown"
                                        : "the transaction was not applied";
  if (stopping) {
    *gave_up = absl::CancelledError(absl::StrCat(Where(),
                                                 ": the store is closing and etcd does not "
                                                 "answer (",
                                                 failure, "); ", outcome));
    return false;
  }
  if (now - unavailable_since_ >= options_.unavailable_for) {
    // A commit queued during a long outage still gets one wait for a connection (request_timeout
    // at most), so that the first one after etcd is back does not fail at once.
    if (!waited_for_connection_) {
      waited_for_connection_ = true;
      if (client_->WaitForConnected(options_.request_timeout)) return true;
    }
    *gave_up = absl::UnavailableError(absl::StrCat(Where(), ": no member answered for ",
                                                   absl::FormatDuration(now - unavailable_since_),
                                                   " (last: ", failure, "); ", outcome));
    return false;
  }
  MutexLock lock(&queue_mu_);
  queue_mu_.AwaitWithTimeout(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return queue_stopping_; }, backoff_);
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  return true;
}

void EtcdKvStore::Answered() {
  unavailable_since_ = absl::InfiniteFuture();
  backoff_ = kFirstBackoff;
}

absl::StatusOr<CommitResult> EtcdKvStore::RunCommit(const std::vector<KvOp>& ops,
                                                    int64_t* event_revision, bool* reply_lost) {
  const int64_t seq = ++commit_seq_;
  waited_for_connection_ = false;
  *reply_lost = false;
  bool& uncertain = *reply_lost;  // an attempt's reply never came
  const internal::CommitReads reads = internal::ReadsFor(ops);
  // Each attempt's plan, by index: the marker names the attempt that landed.
  std::vector<internal::CommitPlan> attempts;
  for (;;) {
    internal::CommitSnapshot snapshot;
    if (!reads.empty() || !attempts.empty()) {
      absl::StatusOr<std::optional<std::pair<size_t, int64_t>>> read =
          ReadForCommit(reads, seq, attempts.size(), &snapshot);
      if (!read.ok()) {
        absl::Status gave_up;
        if (absl::IsUnavailable(read.status()) &&
            StillTrying(std::string(read.status().message()), uncertain, &gave_up)) {
          continue;
        }
        return gave_up.ok() ? read.status() : gave_up;
      }
      Answered();
      if (read->has_value()) {
        // An attempt whose reply never came landed after all.
        const auto [attempt, revision] = **read;
        CommitResult landed = attempts[attempt].result;
        landed.revision = revision;
        *event_revision = attempts[attempt].puts ? revision : 0;
        return landed;
      }
    }
    absl::StatusOr<internal::CommitPlan> plan =
        internal::PlanCommit(ops, reads, snapshot, options_.prefix);
    if (!plan.ok()) return plan.status();
    if (plan->txn.success().empty()) {
      // Nothing to write: the answer holds at the revision read.
      plan->result.revision = snapshot.revision > 0 ? snapshot.revision : revision();
      *event_revision = 0;
      return plan->result;
    }

    // Also conditional on the marker being as this store last saw it, so that of two attempts
    // of one commit at most one lands, and the marker says which.
    etcdserverpb::TxnRequest txn = plan->txn;
    etcdserverpb::Compare* marker_same = txn.add_compare();
    marker_same->set_key(marker_key_);
    marker_same->set_target(etcdserverpb::Compare::MOD);
    marker_same->set_result(etcdserverpb::Compare::EQUAL);
    marker_same->set_mod_revision(marker_mod_revision_);
    etcdserverpb::PutRequest* marker = txn.add_success()->mutable_request_put();
    marker->set_key(marker_key_);
    marker->set_value(absl::StrCat(seq, ":", attempts.size()));
    if (!options_.fence_key.empty()) {
      etcdserverpb::Compare* fence = txn.add_compare();
      fence->set_key(options_.fence_key);
      fence->set_target(etcdserverpb::Compare::CREATE);
      fence->set_result(etcdserverpb::Compare::EQUAL);
      fence->set_create_revision(options_.fence_create_revision);
    }
    attempts.push_back(*plan);

    etcdserverpb::TxnResponse response;
    if (grpc::Status s = client_->Txn(txn, &response); !s.ok()) {
      if (!IsTransient(s)) return RefusedCommit(s, plan->txn);
      uncertain = true;
      absl::Status gave_up;
      if (StillTrying(s.error_message(), uncertain, &gave_up)) continue;
      return gave_up;
    }
    Answered();
    if (!response.succeeded()) {
      // Another writer came first (read again), unless this store's writer lost its claim.
      if (absl::Status fenced = CheckFence(); !fenced.ok()) return fenced;
      continue;
    }
    CommitResult result = std::move(plan->result);
    result.revision = response.header().revision();
    marker_mod_revision_ = result.revision;
    // `done` waits for the watch only when there is something under the prefix to bring.
    bool wrote = plan->puts;
    for (const etcdserverpb::ResponseOp& op : response.responses()) {
      if (op.has_response_delete_range() && op.response_delete_range().deleted() > 0) wrote = true;
    }
    *event_revision = wrote ? result.revision : 0;
    return result;
  }
}

absl::Status EtcdKvStore::CheckFence() const {
  if (options_.fence_key.empty()) return absl::OkStatus();
  etcdserverpb::RangeRequest range;
  range.set_key(options_.fence_key);
  etcdserverpb::RangeResponse response;
  if (grpc::Status s = client_->Range(range, &response); !s.ok()) return absl::OkStatus();
  if (response.kvs_size() == 1 &&
      response.kvs(0).create_revision() == options_.fence_create_revision) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(client_->where(), ": this zerod no longer holds ", options_.fence_key,
                   " (another member leads the state now); nothing was written"));
}

absl::Status EtcdKvStore::RefusedCommit(const grpc::Status& status,
                                        const etcdserverpb::TxnRequest& txn) const {
  std::string what = absl::StrCat("committing a transaction of ", txn.success_size(),
                                  " writes and ", txn.compare_size(), " conditions");
  // etcd's limits on one Txn, which a large job's records can reach: name the flag to raise. Such
  // a Txn can never pass as it is: INVALID_ARGUMENT, whatever code etcd or gRPC gave.
  if (absl::StrContains(status.error_message(), "too many operations")) {
    absl::StrAppend(&what, " (etcd's --max-txn-ops, 128 by default, must allow it)");
    return absl::InvalidArgumentError(client_->Error(status, what).message());
  }
  if (absl::StrContains(status.error_message(), "too large") ||
      internal::IsOverMessageLimit(status)) {
    absl::StrAppend(&what, " of ", txn.ByteSizeLong(),
                    " bytes (etcd's --max-request-bytes, 1.5 MiB by default, must allow it)");
    return absl::InvalidArgumentError(client_->Error(status, what).message());
  }
  return client_->Error(status, what);
}

absl::StatusOr<std::optional<std::pair<size_t, int64_t>>> EtcdKvStore::ReadForCommit(
    const internal::CommitReads& reads, int64_t seq, size_t attempts,
    internal::CommitSnapshot* snapshot) {
  // One read-only Txn: everything at one revision, linearizable.
  etcdserverpb::TxnRequest read;
  auto add_range = [&](const std::string& key, const std::string& end, bool keys_only) {
    etcdserverpb::RangeRequest* range = read.add_success()->mutable_request_range();
    range->set_key(key);
    range->set_range_end(end);
    range->set_keys_only(keys_only);
  };
  add_range(marker_key_, "", false);
  for (const std::string& key : reads.keys) add_range(options_.prefix + key, "", false);
  for (const std::string& p : reads.prefixes) {
    add_range(options_.prefix + p, PrefixEnd(options_.prefix + p), true);
  }
  etcdserverpb::TxnResponse response;
  if (grpc::Status s = client_->Txn(read, &response); !s.ok()) {
    absl::Status error = client_->Error(s, "reading before a commit");
    return IsTransient(s) ? absl::UnavailableError(error.message()) : error;
  }
  snapshot->revision = response.header().revision();
  const auto& marker = response.responses(0).response_range().kvs();
  marker_mod_revision_ = marker.empty() ? 0 : marker[0].mod_revision();
  if (!marker.empty()) {
    // "seq:attempt": did an attempt of this commit land?
    std::pair<std::string, std::string> parts = absl::StrSplit(marker[0].value(), ':');
    int64_t marker_seq = 0;
    size_t attempt = 0;
    if (absl::SimpleAtoi(parts.first, &marker_seq) && marker_seq == seq &&
        absl::SimpleAtoi(parts.second, &attempt) && attempt < attempts) {
      return std::optional<std::pair<size_t, int64_t>>({attempt, marker[0].mod_revision()});
    }
  }
  int index = 1;
  for (const std::string& key : reads.keys) {
    const auto& kvs = response.responses(index++).response_range().kvs();
    if (!kvs.empty()) snapshot->values[key] = {kvs[0].value(), kvs[0].mod_revision()};
  }
  for (const std::string& p : reads.prefixes) {
    std::vector<std::string>& keys = snapshot->prefix_keys[p];
    for (const mvccpb::KeyValue& kv : response.responses(index).response_range().kvs()) {
      keys.push_back(kv.key().substr(options_.prefix.size()));
    }
    ++index;
  }
  return std::optional<std::pair<size_t, int64_t>>();
}

}  // namespace zerod::server
