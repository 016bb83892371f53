#include "server/auth/job_tokens.h"

#include <sys/stat.h>

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

}  // namespace
}  // namespace zerod::server::auth
