#include "server/auth/job_tokens.h"

#include <sys/stat.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/token_digest.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/util/subprocess.h"

namespace zerod::server::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class JobTokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = *SqliteKvStore::Open(dir_.path() + "/state.db", Durability::kNormal);
    tokens_ = Make();
  }
  std::unique_ptr<JobTokens> Make() {
    auto tokens = std::make_unique<JobTokens>(
        kv_.get(),
        [this](const std::string& job) { return presence_[job] != JobPresence::kAbsent; },
        [this](const std::string& job) { return presence_[job] == JobPresence::kEnded; }, admin_);
    EXPECT_TRUE(tokens->Recover().ok());
    return tokens;
  }
  absl::Status Admit(const std::string& job, const Credentials& creds) {
    std::promise<absl::Status> done;
    tokens_->Admit(job, creds, [&done](absl::Status s) { done.set_value(s); });
    return done.get_future().get();
  }

  testing::TempDir dir_;
  std::unique_ptr<SqliteKvStore> kv_;
  const std::string admin_ = NewToken();
  std::map<std::string, JobPresence> presence_;
  std::unique_ptr<JobTokens> tokens_;
};

TEST_F(JobTokensTest, TheFirstJoinOwnsTheJobAndOnlyItsTokenActsOnIt) {
  const std::string mine = NewToken(), theirs = NewToken();
  ASSERT_TRUE(Admit("j", {mine, ""}).ok());
  presence_["j"] = JobPresence::kLive;
  EXPECT_TRUE(tokens_->Check("j", {mine, ""}, "use its Store").ok());
  EXPECT_TRUE(Admit("j", {mine, ""}).ok());

  const absl::Status none = tokens_->Check("j", {}, "use its Store");
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.message(), HasSubstr("job j: no credentials: to use its Store"));
  const absl::Status other = tokens_->Check("j", {theirs, ""}, "end it");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("job j: the token presented is not this job's"));
  EXPECT_THAT(other.message(), Not(HasSubstr(theirs)));
  EXPECT_EQ(Admit("j", {theirs, ""}).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(JobTokensTest, OwnershipIsStoredAsADigestAndSurvivesARestart) {
  const std::string mine = NewToken();
  ASSERT_TRUE(Admit("j", {mine, ""}).ok());
  auto record = kv_->Get(OwnerKey("j"));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->value, TokenDigest(mine));
  EXPECT_THAT(record->value, Not(HasSubstr(mine)));
  presence_["j"] = JobPresence::kEnded;
  tokens_ = Make();
  // Ended or not, the job id stays its owner's.
  EXPECT_TRUE(tokens_->Check("j", {mine, ""}, "end it").ok());
  EXPECT_EQ(Admit("j", {NewToken(), ""}).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(JobTokensTest, TheAdminActsOnEveryJobAndAWrongAdminTokenIsRefused) {
  ASSERT_TRUE(Admit("j", {NewToken(), ""}).ok());
  presence_["j"] = JobPresence::kLive;
  EXPECT_TRUE(tokens_->Check("j", {"", admin_}, "end it").ok());
  EXPECT_EQ(tokens_->Check("j", {"", NewToken()}, "end it").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(JobTokensTest, AJobWithoutOwnerIsTheAdminsWhileLiveAndClaimableOnceEnded) {
  presence_["old"] = JobPresence::kLive;  // stored before authentication existed
  const std::string token = NewToken();
  const absl::Status refused = tokens_->Check("old", {token, ""}, "use its Store");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("job old has no owner token"));
  EXPECT_EQ(Admit("old", {token, ""}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(tokens_->Check("old", {"", admin_}, "use its Store").ok());
  presence_["old"] = JobPresence::kEnded;
  EXPECT_TRUE(Admit("old", {token, ""}).ok());
  EXPECT_TRUE(tokens_->Check("old", {token, ""}, "use its Store").ok());
}

TEST_F(JobTokensTest, AJobThatDoesNotExistIsNotFoundAndAJoinWithoutTokenCannotCreateOne) {
  EXPECT_EQ(tokens_->Check("nope", {NewToken(), ""}, "use its Store").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Admit("nope", {}).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(kv_->Get(OwnerKey("nope")).has_value());
}

TEST_F(JobTokensTest, AClaimWhoseJoinCreatedNothingIsGivenBack) {
  ASSERT_TRUE(Admit("refused", {NewToken(), ""}).ok());
  tokens_->ReleaseIfAbsent("refused");
  ASSERT_TRUE(kv_->CommitSync({KvOp::Put("after", "release")}).ok());  // commits run in order
  EXPECT_FALSE(kv_->Get(OwnerKey("refused")).has_value());
  EXPECT_TRUE(Admit("refused", {NewToken(), ""}).ok());
  presence_["refused"] = JobPresence::kLive;
  tokens_->ReleaseIfAbsent("refused");  // it exists now: the owner stays
  EXPECT_TRUE(kv_->Get(OwnerKey("refused")).has_value());
}

TEST(AdminToken, IsMadePrivateAtFirstStartAndRefusedWhenOthersMayReadIt) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/admin.token";
  auto made = LoadOrCreateAdminToken(path);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->size(), 64u);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*LoadOrCreateAdminToken(path), *made);
  chmod(path.c_str(), 0644);
  const auto open = LoadOrCreateAdminToken(path);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(open.status().message(), HasSubstr("may be read by others (mode 644)"));
}

TEST_F(JobTokensTest, AViewNeedsTheViewerTheAdminOrTheJobsOwnTokenUnlessInspectionIsOpen) {
  const std::string viewer = NewToken(), mine = NewToken();
  tokens_ = std::make_unique<JobTokens>(
      kv_.get(), [this](const std::string& job) { return presence_[job] != JobPresence::kAbsent; },
      [this](const std::string& job) { return presence_[job] == JobPresence::kEnded; }, admin_,
      ViewPolicy{.viewer_token = viewer});
  ASSERT_TRUE(Admit("j", {mine, ""}).ok());
  for (const std::string& job : {std::string(), std::string("j")}) {
    SCOPED_TRACE(job.empty() ? "every job" : job);
    EXPECT_TRUE(tokens_->CheckView(job, {.viewer_token = viewer}).ok());
    EXPECT_TRUE(tokens_->CheckView(job, {.admin_token = admin_}).ok());
    const absl::Status none = tokens_->CheckView(job, {});
    EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(none.message(),
                HasSubstr("no credentials: over TCP a call needs the viewer token"));
    const absl::Status wrong = tokens_->CheckView(job, {.viewer_token = NewToken()});
    EXPECT_EQ(wrong.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(wrong.message(), Not(HasSubstr(viewer)));
  }
  // A job's own token shows that job, neither another's nor the list of all.
  EXPECT_TRUE(tokens_->CheckView("j", {.job_token = mine}).ok());
  EXPECT_EQ(tokens_->CheckView("other", {.job_token = mine}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tokens_->CheckView("", {.job_token = mine}).code(),
            absl::StatusCode::kPermissionDenied);

  JobTokens open(
      kv_.get(), [](const std::string&) { return true; }, [](const std::string&) { return false; },
      admin_, ViewPolicy{.open = true});
  EXPECT_TRUE(open.CheckView("", {}).ok());
}

TEST_F(JobTokensTest, OnlyTheViewerAndAdminTokensOpenTheHttpListenerNotAJobsOwn) {
  const std::string viewer = NewToken(), mine = NewToken();
  tokens_ = std::make_unique<JobTokens>(
      kv_.get(), [this](const std::string& job) { return presence_[job] != JobPresence::kAbsent; },
      [this](const std::string& job) { return presence_[job] == JobPresence::kEnded; }, admin_,
      ViewPolicy{.viewer_token = viewer});
  ASSERT_TRUE(Admit("j", {mine, ""}).ok());
  EXPECT_TRUE(tokens_->IsViewerOrAdmin(viewer));
  EXPECT_TRUE(tokens_->IsViewerOrAdmin(admin_));
  EXPECT_FALSE(tokens_->IsViewerOrAdmin(mine));
  EXPECT_FALSE(tokens_->IsViewerOrAdmin(NewToken()));
  EXPECT_FALSE(tokens_->IsViewerOrAdmin(""));
  EXPECT_FALSE(tokens_->IsViewerOrAdmin(TokenDigest(viewer))) << "the digest is not the token";
  EXPECT_FALSE(tokens_->inspection_open());
  // Without a viewer token (inspection open) an empty one matches nothing either.
  JobTokens open(
      kv_.get(), [](const std::string&) { return true; }, [](const std::string&) { return false; },
      admin_, ViewPolicy{.open = true});
  EXPECT_TRUE(open.inspection_open());
  EXPECT_FALSE(open.IsViewerOrAdmin(""));
  EXPECT_TRUE(open.IsViewerOrAdmin(admin_));
}

TEST(ViewerToken, IsMadeForItsGroupAndALinkOrAnotherUsersFileIsRefused) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/viewer.token";
  auto made = LoadOrCreateViewerToken(path, getegid());
  ASSERT_TRUE(made.ok()) << made.status();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  // Without a group at the next start it is the daemon user's alone again.
  EXPECT_EQ(*LoadOrCreateViewerToken(path, static_cast<gid_t>(-1)), *made);
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const std::string link = dir.path() + "/link.token";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_THAT(LoadOrCreateViewerToken(link, static_cast<gid_t>(-1)).status().message(),
              HasSubstr("viewer token " + link + " is a symbolic link"));
  EXPECT_THAT(LoadOrCreateAdminToken(link).status().message(),
              HasSubstr("admin token " + link + " is a symbolic link"));
  if (geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
    EXPECT_THAT(LoadOrCreateAdminToken(path).status().message(),
                HasSubstr("belongs to uid 65534, not to zerod's user"));
  }
}

}  // namespace
}  // namespace zerod::server::auth
