#include "client/credentials.h"

#include <sys/stat.h>

#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "tests/util/subprocess.h"

namespace zerod::client {
namespace {

// Points the config dir at a temp dir and clears the token variables for one test.
class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("XDG_CONFIG_HOME", dir_.path().c_str(), 1);
    unsetenv("ZEROD_JOB_TOKEN");
    unsetenv("ZEROD_JOB");
  }
  void TearDown() override {
    unsetenv("XDG_CONFIG_HOME");
    unsetenv("ZEROD_JOB_TOKEN");
    unsetenv("ZEROD_JOB");
  }
  testing::TempDir dir_;
};

TEST_F(CredentialsTest, RanksStartingTogetherAgreeOnOneSavedToken) {
  Mutex mu;
  std::set<std::string> tokens;
  std::vector<std::thread> ranks;
  for (int i = 0; i < 8; ++i) {
    ranks.emplace_back([&] {
      auto token = JobTokenOrNew("job/with spaces");
      ASSERT_TRUE(token.ok()) << token.status();
      MutexLock lock(&mu);
      tokens.insert(*token);
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(tokens.begin()->size(), 64u);
  const std::string path = JobTokenPath("job/with spaces");
  EXPECT_EQ(path, dir_.path() + "/zerod/jobs/job%2Fwith%20spaces.token");
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((dir_.path() + "/zerod/jobs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(JobTokenFor("job/with spaces"), *tokens.begin());
}

TEST_F(CredentialsTest, TheEnvironmentsTokenIsUsedForItsOwnJobOnly) {
  const std::string saved = *JobTokenOrNew("other");
  setenv("ZEROD_JOB_TOKEN", "from-the-launcher", 1);
  EXPECT_EQ(JobTokenFor("anything"), "from-the-launcher");  // no ZEROD_JOB: any job
  setenv("ZEROD_JOB", "mine", 1);
  EXPECT_EQ(JobTokenFor("mine"), "from-the-launcher");
  EXPECT_EQ(JobTokenFor("other"), saved);
  EXPECT_EQ(JobTokenFor("unknown"), "");
  ForgetJobToken("other");
  EXPECT_EQ(JobTokenFor("other"), "");
}

}  // namespace
}  // namespace zerod::client
