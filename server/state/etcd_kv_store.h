#ifndef ZEROD_SERVER_STATE_ETCD_KV_STORE_H_
#define ZEROD_SERVER_STATE_ETCD_KV_STORE_H_

// The etcd KvStore: the daemon's state in an etcd cluster (v3 API over gRPC), so that several
// daemons can share it and it survives the loss of a machine.
//
// Reads serve an in-memory mirror of every key under the prefix, loaded by one Range at revision
// R and kept current by a watch from R+1, which also sees the writes of other clients of the same
// etcd (other daemons). revision() is etcd's revision. Damaged() is always empty: etcd checks its
// own data (its backend and raft log carry their own checksums).
//
// Commit() is asynchronous; each transaction is one etcd Txn, so it is atomic. Commits queued
// while one is in flight go together in the next Txn (group commit: one round trip and one raft
// entry for up to 3/4 of etcd's --max-txn-ops and 1 MiB), each with the results it would have had
// alone, all at one revision; when such a group fails for what may be one commit's fault, its
// commits run one by one. An add or a compare-and-swap reads its keys from etcd (not the mirror),
// and the Txn is conditional on their mod_revisions; when another writer got there first it reads
// again and retries. Every Txn also writes this store's commit marker (a key outside the prefix
// holding the commit's sequence number) and is conditional on the marker being as this store last
// wrote it, so a retry after a reply that never came can tell whether the first attempt landed, and
// a transaction is never applied twice. `done` runs once the commit's revision is in the mirror.
// While no member answers, a commit retries for unavailable_for (then waits request_timeout for a
// connection once more), then fails UNAVAILABLE naming the endpoints and saying whether the
// transaction may have been applied; later commits fail after that one wait until etcd answers.
// etcd's own limits apply to one transaction:
// --max-txn-ops (128 writes by default) and
// --max-request-bytes (1.5 MiB); beyond them a commit fails INVALID_ARGUMENT naming the flag.
//
// Owns three threads: the committer (runs the queued transactions against etcd, one group at a
// time, in Commit order), the watch thread (reads the watch stream and applies it to the mirror; it
// reconnects from the last revision it saw, and reloads the mirror when etcd compacted past it),
// and the callback thread (runs watch callbacks under the watchers' lock, as SqliteKvStore does,
// then the `done` callbacks of commits the mirror has caught up with, under no lock). The
// destructor lets queued commits run while etcd answers (failing them CANCELLED once it does
// not), waits up to request_timeout for their `done`, cancels the watch and joins the threads.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/state/kv_store.h"
#include "server/state/kv_watchers.h"

namespace etcdserverpb {
class TxnRequest;
class WatchResponse;
}  // namespace etcdserverpb
namespace grpc {
class ClientContext;
class Status;
}  // namespace grpc

namespace zerod::server {

namespace internal {
class EtcdClient;
struct CommitReads;
struct CommitSnapshot;
}  // namespace internal

// How zerod speaks to etcd: plaintext when `ca_pem` is empty; else TLS, each member's certificate
// checked against `ca_pem` and the endpoints' names, presenting `cert_pem`/`key_pem` when given
// (etcd's client-certificate authentication: with --client-cert-auth it takes the certificate's CN
// as the user). PEM contents, read once from the files named by --etcd-ca/-cert/-key
// (etcd_security.h).
struct EtcdTls {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  bool enabled() const { return !ca_pem.empty(); }
};

struct EtcdOptions {
  std::vector<std::string> endpoints;                 // "host:port", at least one
  EtcdTls tls;                                        // plaintext by default
  std::string prefix = "/zerod/";                     // every KvStore key is stored as prefix + key
  absl::Duration request_timeout = absl::Seconds(5);  // one RPC to etcd
  absl::Duration unavailable_for =
      absl::Seconds(30);  // how long a commit retries while no member answers
  // Fencing: when set, every write is also conditional on this key having been created at
  // fence_create_revision (the etcd claim its writer holds, etcd_claim.h), so a daemon that lost
  // its claim (paused past its lease while another took over) can write nothing more: its commits
  // fail FAILED_PRECONDITION.
  std::string fence_key;
  int64_t fence_create_revision = 0;
  // etcd's --max-txn-ops (its default: 128). A group commit holds up to three quarters of it in
  // ops (the rest is room for the reads' conditions, the marker and the fence), and 1 MiB.
  int64_t max_txn_ops = 128;
};

// Where the stores on `prefix` keep their commit markers: beside the prefix, outside it ("/zerod/"
// -> "/zerod.commit/"), so the mirror never sees them. zerod's etcd role needs read and write on
// the prefix, on its claim key (etcd_claim.h) and under this one.
std::string CommitMarkerPrefix(const std::string& prefix);

// "etcd://host:port[,host:port...][/prefix]" -> options; INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<EtcdOptions> ParseEtcdUrl(std::string_view url);

class EtcdKvStore final : public KvStore {
 public:
  // Connects, loads everything under the prefix into the in-memory mirror (one Range at a
  // revision R), then watches the prefix from R+1. UNAVAILABLE naming the endpoints when no
  // member answers within request_timeout.
  static absl::StatusOr<std::unique_ptr<EtcdKvStore>> Open(const EtcdOptions& options);
  ~EtcdKvStore() override;
  EtcdKvStore(const EtcdKvStore&) = delete;
  EtcdKvStore& operator=(const EtcdKvStore&) = delete;

  std::optional<KeyValue> Get(const std::string& key) const override;
  std::vector<KeyValue> Range(const std::string& prefix) const override;
  int64_t revision() const override;
  std::vector<DamagedRecord> Damaged(const std::string& prefix) const override;
  void Commit(std::vector<KvOp> ops, CommitCallback done) override;
  int64_t Watch(const std::string& prefix, WatchCallback callback) override;
  void Unwatch(int64_t id) override;

 private:
  struct Pending {
    std::vector<KvOp> ops;
    CommitCallback done;
  };
  // A commit etcd applied, waiting for the mirror to reach its revision.
  struct Applied {
    int64_t revision = 0;  // 0: wrote nothing under the prefix, ready at once
    absl::StatusOr<CommitResult> result;
    CommitCallback done;
  };

  EtcdKvStore(EtcdOptions options, std::unique_ptr<internal::EtcdClient> client);
  void Start();

  void CommitterLoop();
  // The commits at the front of the queue that go to etcd as one Txn (group commit): the front
  // one, and those behind it while the group stays within etcd's default limits.
  std::vector<Pending> TakeGroup() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_);
  // Runs a group as one transaction, or each of its commits alone when the group failed for what
  // may be one commit's fault; their outcomes in order.
  std::vector<Applied> RunGroup(std::vector<Pending>& group);
  // Runs one transaction against etcd to the end: applied, failed, or given up on.
  // `event_revision`: the revision the watch must bring before `done` runs (0: none);
  // `reply_lost`: whether an attempt's reply never came (it may have landed, whatever the result).
  absl::StatusOr<CommitResult> RunCommit(const std::vector<KvOp>& ops, int64_t* event_revision,
                                         bool* reply_lost);
  // Reads what `reads` asks for into `snapshot`, with the marker: the attempt of commit `seq`
  // that landed and its revision, if one did. UNAVAILABLE when etcd did not answer.
  absl::StatusOr<std::optional<std::pair<size_t, int64_t>>> ReadForCommit(
      const internal::CommitReads& reads, int64_t seq, size_t attempts,
      internal::CommitSnapshot* snapshot);
  // A Txn etcd refused (not for want of a member): the error, naming the limit it hit if any.
  absl::Status RefusedCommit(const grpc::Status& status, const etcdserverpb::TxnRequest& txn) const;
  // FAILED_PRECONDITION when the fence (EtcdOptions::fence_key) is no longer as it was.
  absl::Status CheckFence() const;
  // After a call that found no member (`failure`): waits a backoff and returns true, or returns
  // false with `gave_up` once etcd has been unavailable for unavailable_for or the store closes.
  bool StillTrying(const std::string& failure, bool uncertain, absl::Status* gave_up);
  // A call was answered: etcd is available again.
  void Answered();

  void WatchLoop();
  // Reads one watch stream from `start_revision` until it ends: the next revision to watch
  // from, or OUT_OF_RANGE when etcd compacted past it.
  absl::StatusOr<int64_t> WatchFrom(int64_t start_revision);
  // Replaces the mirror with a fresh Range (and queues the difference for the watchers).
  absl::Status Reload(bool tell_watchers);
  // Applies etcd's events (keys with the prefix) to the mirror and queues them for the watchers.
  void ApplyEvents(const etcdserverpb::WatchResponse& response);
  void CallbackLoop();
  // "etcd at h1:p1,h2:p2" for messages.
  std::string Where() const;

  const EtcdOptions options_;
  const std::unique_ptr<internal::EtcdClient> client_;
  // This store's commit marker: CommitMarkerPrefix(prefix) + a random id.
  const std::string marker_key_;

  mutable Mutex mu_;
  std::map<std::string, KeyValue> data_ ABSL_GUARDED_BY(mu_);  // keys without the prefix
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::vector<KvEvent>> to_deliver_ ABSL_GUARDED_BY(mu_);
  std::deque<Applied> applied_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;

  Mutex queue_mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool queue_stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  KvWatchers watchers_;

  // Committer thread only.
  int64_t commit_seq_ = 0;
  int64_t marker_mod_revision_ = 0;  // the marker as this store last wrote it (0: absent)
  absl::Time unavailable_since_ = absl::InfiniteFuture();
  absl::Duration backoff_ = absl::Milliseconds(50);
  bool waited_for_connection_ = false;  // this commit, once unavailable_for has passed

  std::thread committer_;
  std::thread watcher_;
  std::thread callbacks_;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_ETCD_KV_STORE_H_
