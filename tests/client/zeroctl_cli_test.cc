// zeroctl's command line as a user types it, without a daemon: global flags before the
// subcommand, and the error for a subcommand it does not know.

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/subprocess.h"

namespace zerod {
namespace {

using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::RunProcess;

ProcessResult Zeroctl(std::vector<std::string> args) {
  args.insert(args.begin(), ZEROCTL_PATH);
  return RunProcess(args);
}

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

TEST(ZeroctlCli, UnknownCommandIsNamedWithTheKnownOnes) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"jbos"}, {"--json", "jbos"}, {"--endpoint", "unix:///nowhere.sock", "jbos", "x"}}) {
    const ProcessResult r = Zeroctl(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err,
              "zeroctl: unknown command 'jbos' (expected one of: plan, jobs, members, shards, "
              "memory, watch, checkpoints, end, checkpoint)\n");
    EXPECT_EQ(r.out, "");
  }
}

TEST(ZeroctlCli, AMissingCommandIsStillOneLine) {
  const ProcessResult r = Zeroctl({"--json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("subcommand"));
  EXPECT_EQ(Lines(r.err), 1) << r.err;
}

// --timeout is checked before any connection, so its error shows where the flag landed.
TEST(ZeroctlCli, TimeoutReachesTheCommandFromEitherSide) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--timeout", "soon", "members", "j"}, {"members", "j", "--timeout", "soon"}}) {
    const ProcessResult r = Zeroctl(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, "zeroctl: --timeout: expected a duration like 10s, got 'soon'\n");
  }
}

// Nothing listens there: both orders reach the same endpoint and fail the same way.
TEST(ZeroctlCli, EndpointReachesTheCommandFromEitherSide) {
  testing::TempDir dir;
  const std::string endpoint = "unix://" + dir.path() + "/absent.sock";
  const ProcessResult before = Zeroctl({"--endpoint", endpoint, "--timeout", "200ms", "jobs"});
  const ProcessResult after = Zeroctl({"jobs", "--endpoint", endpoint, "--timeout", "200ms"});
  EXPECT_EQ(before.exit_code, 1) << before.err;
  EXPECT_THAT(before.err, HasSubstr(endpoint));
  EXPECT_EQ(Lines(before.err), 1) << before.err;
  EXPECT_EQ(after.exit_code, before.exit_code);
  EXPECT_EQ(after.err, before.err);
}

TEST(ZeroctlCli, JsonBeforePlanIsPlansJson) {
  const ProcessResult before = Zeroctl({"--json", "plan", "--params", "1M", "--dp", "2"});
  const ProcessResult after = Zeroctl({"plan", "--params", "1M", "--dp", "2", "--json"});
  ASSERT_EQ(before.exit_code, 0) << before.err;
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(nlohmann::json::parse(before.out), nlohmann::json::parse(after.out));
}

TEST(ZeroctlCli, HelpListsTheGlobalFlagsAndCommands) {
  const ProcessResult r = Zeroctl({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* word : {"--endpoint", "--json", "--timeout", "plan", "jobs", "watch"}) {
    EXPECT_THAT(r.out, HasSubstr(word));
  }
}

}  // namespace
}  // namespace zerod
