#ifndef ZEROD_SERVER_AUTH_JOB_TOKENS_H_
#define ZEROD_SERVER_AUTH_JOB_TOKENS_H_

// JobTokens: who may act on a job. A job belongs to the token its first join presented: a
// per-job secret its launcher made (zerorun; the SDK when a rank is started without it). Whoever
// presents that token may act as the job's ranks, use its Store and end it; the admin token may
// act on every job. The daemon keeps only SHA-256 digests, in memory and in the KvStore under
// auth/jobs/<job>, so ownership survives a restart. No gRPC here: call_auth.h reads the
// credentials off a call.
//
// A job known to the registry without a digest was created before zerod had authentication: only
// the admin may act on it, until it has ended (then the next join claims it).
//
// Read-only views (CheckView) over TCP need a credential too: TCP has no file mode or group to
// gate who connects, so the viewer token (DATA_DIR/viewer.token, readable by --viewer-group)
// stands for the "configured group"; the admin token and a job's own token (for that job's views)
// serve as well, and --open-inspection opens them to whoever may connect.
//
// Thread-safe. Admit's `done` runs at once or on the KvStore's writer thread.

#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/common/mutex.h"
#include "server/auth/cluster_members.h"
#include "server/state/kv_store.h"

namespace zerod::server::auth {

// What a call presented; empty strings: not presented.
struct Credentials {
  std::string job_token;
  std::string admin_token;
  std::string viewer_token;
};

// Who may use the read-only views over TCP (the Unix socket's mode and group gate them there).
struct ViewPolicy {
  std::string viewer_token;  // empty: there is no viewer token
  bool open = false;         // --open-inspection: anyone who can connect
  // A cluster's members (--store etcd, cluster_members.h): a call a member forwarded, whose caller
  // came through the member's Unix socket, is taken as a caller on this daemon's socket. Null: not
  // in a cluster, or members are not authenticated.
  std::shared_ptr<const ClusterMembers> cluster_members;
};

// Where a job is in its life, as far as claiming it is concerned.
enum class JobPresence { kAbsent, kEnded, kLive };

class JobTokens {
 public:
  // The registry's view of a job: `exists` (asked after every refused join, so it must be cheap)
  // and `ended` (asked only about jobs without an owner). `admin_token`: empty means no admin.
  JobTokens(KvStore* kv, std::function<bool(const std::string&)> exists,
            std::function<bool(const std::string&)> ended, absl::string_view admin_token,
            const ViewPolicy& views = {});

  // Loads the digests from the KvStore (daemon start).
  absl::Status Recover();

  // OK when `creds` may do `action` (words for the message: "use its Store") on `job_id`: the
  // job's token or the admin's. Otherwise UNAUTHENTICATED (nothing presented) or
  // PERMISSION_DENIED, naming the job and never the token. A job that does not exist is
  // NOT_FOUND, as it would be without authentication.
  absl::Status Check(const std::string& job_id, const Credentials& creds,
                     absl::string_view action) const;

  // For a read-only view over TCP of `job_id` (empty: of every job, as ListJobs): OK with the
  // admin or viewer token, the job's own token, or when inspection is open. Otherwise
  // UNAUTHENTICATED (nothing presented) or PERMISSION_DENIED, saying which credential would do.
  absl::Status CheckView(const std::string& job_id, const Credentials& creds) const;

  // Whether `token` is the viewer or the admin token (compared in constant time): what the HTTP
  // listener needs (server/status/access_gate.h), since its page shows every job at once; a job's
  // own token is not enough there.
  bool IsViewerOrAdmin(absl::string_view token) const;
  // --open-inspection: the read-only views, gRPC and HTTP, need no token.
  bool inspection_open() const { return open_views_; }
  // Whether the TLS peer certificate `leaf_pem` (with the intermediates it sent) is a member's of
  // this daemon's cluster (ViewPolicy::cluster_members); false when there is none.
  bool IsClusterMember(absl::string_view leaf_pem, absl::string_view chain_pem) const;

  // For a join: Check, except that a job nobody owns (absent, or ended without an owner) becomes
  // the presented job token's, durably, before `done(OK)`.
  void Admit(const std::string& job_id, const Credentials& creds,
             std::function<void(absl::Status)> done);

  // After an admitted join was refused: when the job does not exist (the refusal created
  // nothing), its owner record goes, so refused joins cannot fill the state with owners of jobs
  // that never were.
  void ReleaseIfAbsent(const std::string& job_id);

 private:
  enum class Verdict { kAllowed, kNoOwner, kDenied };
  // kNoOwner: the job has no digest. Fills `refusal` when kDenied.
  Verdict Judge(const std::string& job_id, const Credentials& creds, absl::string_view action,
                absl::Status* refusal) const;
  bool IsAdmin(const Credentials& creds) const;
  JobPresence PresenceOf(const std::string& job_id) const;

  KvStore* const kv_;
  const std::function<bool(const std::string&)> exists_;
  const std::function<bool(const std::string&)> ended_;
  const std::string admin_digest_;   // empty: no admin
  const std::string viewer_digest_;  // empty: no viewer token
  const bool open_views_;
  const std::shared_ptr<const ClusterMembers> cluster_members_;  // null: not in a cluster

  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::string> digests_ ABSL_GUARDED_BY(mu_);
};

// The KvStore key of a job's owner digest.
std::string OwnerKey(const std::string& job_id);

}  // namespace zerod::server::auth

#endif  // ZEROD_SERVER_AUTH_JOB_TOKENS_H_
