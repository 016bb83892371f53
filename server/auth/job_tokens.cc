#include "server/auth/job_tokens.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/auth/token_digest.h"
#include "server/job_registry.h"
#include "server/join_admission.h"

namespace zerod::server::auth {
namespace {

constexpr char kOwnerPrefix[] = "auth/jobs/";

}  // namespace

std::string OwnerKey(const std::string& job_id) { return kOwnerPrefix + job_id; }

JobTokens::JobTokens(KvStore* kv, std::function<bool(const std::string&)> exists,
                     std::function<bool(const std::string&)> ended, absl::string_view admin_token,
                     const ViewPolicy& views)
    : kv_(kv),
      exists_(std::move(exists)),
      ended_(std::move(ended)),
      admin_digest_(admin_token.empty() ? "" : TokenDigest(admin_token)),
      viewer_digest_(views.viewer_token.empty() ? "" : TokenDigest(views.viewer_token)),
      open_views_(views.open),
      cluster_members_(views.cluster_members) {}

bool JobTokens::IsClusterMember(absl::string_view leaf_pem, absl::string_view chain_pem) const {
  return cluster_members_ != nullptr && cluster_members_->IsMember(leaf_pem, chain_pem);
}

JobPresence JobTokens::PresenceOf(const std::string& job_id) const {
  if (!exists_(job_id)) return JobPresence::kAbsent;
  return ended_(job_id) ? JobPresence::kEnded : JobPresence::kLive;
}

absl::Status JobTokens::Recover() {
  const std::string prefix = kOwnerPrefix;
  MutexLock lock(&mu_);
  for (KeyValue& kv : kv_->Range(prefix)) {
    digests_[kv.key.substr(prefix.size())] = std::move(kv.value);
  }
  return absl::OkStatus();
}

bool JobTokens::IsAdmin(const Credentials& creds) const {
  return !admin_digest_.empty() && !creds.admin_token.empty() &&
         SameDigest(TokenDigest(creds.admin_token), admin_digest_);
}

JobTokens::Verdict JobTokens::Judge(const std::string& job_id, const Credentials& creds,
                                    absl::string_view action, absl::Status* refusal) const {
  if (IsAdmin(creds)) return Verdict::kAllowed;
  // Hashed before the lock: the lock guards a map lookup, nothing more.
  const std::string presented = creds.job_token.empty() ? "" : TokenDigest(creds.job_token);
  std::string owner;
  {
    MutexLock lock(&mu_);
    auto it = digests_.find(job_id);
    if (it == digests_.end()) return Verdict::kNoOwner;
    owner = it->second;
  }
  if (!presented.empty() && SameDigest(presented, owner)) return Verdict::kAllowed;
  const std::string job = ShownJobId(job_id);
  if (presented.empty() && creds.admin_token.empty()) {
    *refusal = absl::UnauthenticatedError(absl::StrCat(
        "job ", job, ": no credentials: to ", action,
        " a call needs the job's token (zerorun gives its ranks ZEROD_JOB_TOKEN) or the admin "
        "token"));
  } else {
    *refusal = absl::PermissionDeniedError(
        absl::StrCat("job ", job, ": the token presented is not this job's: to ", action,
                     " a call needs the job's token or the admin token"));
  }
  return Verdict::kDenied;
}

bool JobTokens::IsViewerOrAdmin(absl::string_view token) const {
  if (token.empty()) return false;
  const std::string presented = TokenDigest(token);
  // Both compared, whichever matches: the time taken says nothing about which token it was.
  const bool admin = !admin_digest_.empty() && SameDigest(presented, admin_digest_);
  const bool viewer = !viewer_digest_.empty() && SameDigest(presented, viewer_digest_);
  return admin || viewer;
}

absl::Status JobTokens::CheckView(const std::string& job_id, const Credentials& creds) const {
  if (open_views_ || IsAdmin(creds)) return absl::OkStatus();
  if (!viewer_digest_.empty() && !creds.viewer_token.empty() &&
      SameDigest(TokenDigest(creds.viewer_token), viewer_digest_)) {
    return absl::OkStatus();
  }
  if (!job_id.empty() && !creds.job_token.empty()) {
    const std::string presented = TokenDigest(creds.job_token);
    MutexLock lock(&mu_);
    auto it = digests_.find(job_id);
    if (it != digests_.end() && SameDigest(presented, it->second)) return absl::OkStatus();
  }
  const std::string what =
      job_id.empty() ? "to list jobs" : absl::StrCat("job ", ShownJobId(job_id), ": to inspect it");
  const std::string needs =
      " over TCP a call needs the viewer token (zeroctl reads $ZEROD_VIEWER_TOKEN_FILE, else "
      "/var/lib/zerod/viewer.token; zerod's --viewer-group may read it), the admin token";
  const std::string job_part = job_id.empty() ? "" : ", or the job's own token";
  const std::string open = " (or zerod runs with --open-inspection)";
  if (creds.job_token.empty() && creds.admin_token.empty() && creds.viewer_token.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat(what, ": no credentials:", needs, job_part, open));
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, ": the token presented does not allow it:", needs, job_part, open));
}

absl::Status JobTokens::Check(const std::string& job_id, const Credentials& creds,
                              absl::string_view action) const {
  absl::Status refusal;
  switch (Judge(job_id, creds, action, &refusal)) {
    case Verdict::kAllowed:
      return absl::OkStatus();
    case Verdict::kDenied:
      return refusal;
    case Verdict::kNoOwner:
      break;
  }
  // Only a join may take a job nobody owns.
  if (!exists_(job_id)) return JobNotFound(job_id);
  return absl::PermissionDeniedError(
      absl::StrCat("job ", ShownJobId(job_id),
                   " has no owner token (it was created before zerod had "
                   "authentication): only the admin may ",
                   action));
}

void JobTokens::Admit(const std::string& job_id, const Credentials& creds,
                      std::function<void(absl::Status)> done) {
  absl::Status refusal;
  switch (Judge(job_id, creds, "join it", &refusal)) {
    case Verdict::kAllowed:
      return done(absl::OkStatus());
    case Verdict::kDenied:
      return done(refusal);
    case Verdict::kNoOwner:
      break;
  }
  const std::string job = ShownJobId(job_id);
  if (PresenceOf(job_id) == JobPresence::kLive) {
    return done(absl::PermissionDeniedError(
        absl::StrCat("job ", job,
                     " has no owner token (it was created before zerod had "
                     "authentication): only the admin may join it until it ends")));
  }
  if (creds.job_token.empty()) {
    return done(absl::UnauthenticatedError(
        absl::StrCat("job ", job,
                     ": no job token: the join that creates a job gives the token that owns it "
                     "(zerorun sets ZEROD_JOB_TOKEN)")));
  }
  const std::string digest = TokenDigest(creds.job_token);
  std::optional<bool> earlier_claim_is_ours;  // set when another join claimed it since Judge
  {
    MutexLock lock(&mu_);
    auto [it, claimed] = digests_.try_emplace(job_id, digest);
    if (!claimed) earlier_claim_is_ours = SameDigest(it->second, digest);
  }
  if (earlier_claim_is_ours.has_value()) {
    return done(*earlier_claim_is_ours
                    ? absl::OkStatus()
                    : absl::PermissionDeniedError(
                          absl::StrCat("job ", job,
                                       ": the token presented is not this job's: to join it a "
                                       "call needs the job's token or the admin token")));
  }
  // The owner is on disk before the job can be: a restart never finds the job without it.
  kv_->Commit({KvOp::Put(OwnerKey(job_id), digest)}, [this, job_id, digest, done = std::move(done)](
                                                         absl::StatusOr<CommitResult> r) {
    if (r.ok()) return done(absl::OkStatus());
    {
      MutexLock lock(&mu_);
      auto it = digests_.find(job_id);
      if (it != digests_.end() && it->second == digest) digests_.erase(it);
    }
    done(absl::UnavailableError(absl::StrCat(
        "job ", ShownJobId(job_id), ": could not store its owner: ", r.status().message())));
  });
}

void JobTokens::ReleaseIfAbsent(const std::string& job_id) {
  if (exists_(job_id)) return;
  {
    MutexLock lock(&mu_);
    if (digests_.erase(job_id) == 0) return;
  }
  // Best effort: a record left behind only keeps an id that nobody uses reserved.
  kv_->Commit({KvOp::Delete(OwnerKey(job_id))}, [](absl::StatusOr<CommitResult>) {});
}

}  // namespace zerod::server::auth
