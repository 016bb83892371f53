// zerod's settings and logs, with the real binary: flags, ZEROD_* variables and a TOML config file
// in their one order (command line > environment > file > default), a key that is no flag, and
// --log-format json lines naming the job, rank and generation.

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The variables these tests set for the child; one inherited from the test's environment would
// win (ChildProcess appends the child's).
void ClearSettingsEnvironment() {
  for (const char* name : {"ZEROD_CONFIG", "ZEROD_SOCKET_MODE", "ZEROD_LOG_FORMAT", "ZEROD_NO_AUTH",
                           "ZEROD_LOG_LEVEL", "ZEROD_DATA_DIR", "ZEROD_SOCKET", "ZEROD_LISTEN"}) {
    unsetenv(name);
  }
}

struct Started {
  int mode = -1;  // the socket's permission bits
  std::string log;
};

// Starts zerod with `flags` and `env`, reads the mode of its socket once it listens, stops it.
Started StartAndStop(const TempDir& dir, const std::vector<std::string>& flags,
                     const std::vector<std::string>& env) {
  const std::string socket = dir.path() + "/zerod.sock", log = dir.path() + "/zerod.log";
  std::remove(log.c_str());
  std::vector<std::string> argv = {Built(ZEROD_PATH), "--socket",          socket, "--listen", "",
                                   "--data-dir",      dir.path() + "/data"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ChildProcess zerod(argv, log, env);
  Started run;
  const absl::Time end = absl::Now() + Scaled(absl::Seconds(60));
  while (!absl::StrContains(ReadFile(log), "listening on unix:") && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  struct stat st {};
  if (stat(socket.c_str(), &st) == 0) run.mode = static_cast<int>(st.st_mode & 0777);
  zerod.Signal(SIGTERM);
  EXPECT_EQ(zerod.Wait(absl::Seconds(30)), 0) << ReadFile(log);
  run.log = ReadFile(log);
  return run;
}

TEST(Settings, TheCommandLineBeatsTheEnvironmentWhichBeatsTheConfigFileWhichBeatsTheDefault) {
  ClearSettingsEnvironment();
  TempDir dir;
  const std::string config = dir.WriteFile("zerod.toml",
                                           "# zerod's flags without the dashes\n"
                                           "socket-mode = \"0600\"\n"
                                           "no-auth = true\n"
                                           "log-format = \"json\"\n");
  // The default alone.
  Started run = StartAndStop(dir, {}, {});
  EXPECT_EQ(run.mode, 0660) << run.log;
  EXPECT_THAT(run.log, HasSubstr("authentication on"));
  // The file sets all three.
  run = StartAndStop(dir, {"--config", config}, {});
  EXPECT_EQ(run.mode, 0600) << run.log;
  EXPECT_THAT(run.log, HasSubstr("authentication off"));
  EXPECT_TRUE(json::accept(run.log.substr(0, run.log.find('\n')))) << run.log;
  // The environment beats the file (ZEROD_CONFIG names the file as --config would).
  run = StartAndStop(dir, {}, {"ZEROD_CONFIG=" + config, "ZEROD_SOCKET_MODE=0640"});
  EXPECT_EQ(run.mode, 0640) << run.log;
  EXPECT_THAT(run.log, HasSubstr("authentication off"));
  // The command line beats both.
  run = StartAndStop(dir, {"--config", config, "--socket-mode", "0620", "--log-format", "text"},
                     {"ZEROD_SOCKET_MODE=0640"});
  EXPECT_EQ(run.mode, 0620) << run.log;
  EXPECT_FALSE(json::accept(run.log.substr(0, run.log.find('\n')))) << run.log;
}

TEST(Settings, AConfigKeyThatIsNoFlagIsAUsageErrorNamingItAndTouchesNothing) {
  ClearSettingsEnvironment();
  TempDir dir;
  StartAndStop(dir, {}, {});  // a state to keep
  const std::string db = dir.path() + "/data/zerod.db";
  const std::string before = ReadFile(db);
  ASSERT_FALSE(before.empty());
  for (const std::string& text : {std::string("socket-mode = \"0600\"\nsocket-mdoe = \"0666\"\n"),
                                  std::string("[daemon]\nsocket-mode = \"0600\"\n")}) {
    const std::string config = dir.WriteFile("bad.toml", text);
    const ProcessResult r = RunProcess({Built(ZEROD_PATH), "--socket", dir.path() + "/zerod.sock",
                                        "--data-dir", dir.path() + "/data", "--config", config});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(config));
    EXPECT_THAT(r.err,
                HasSubstr(absl::StrContains(text, "[daemon]") ? "[daemon]" : "'socket-mdoe'"));
  }
  const ProcessResult missing =
      RunProcess({Built(ZEROD_PATH), "--config", dir.path() + "/none.toml"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("none.toml"));
  EXPECT_EQ(ReadFile(db), before);
}

TEST(Settings, TheShippedExampleConfigStartsTheDaemon) {
  ClearSettingsEnvironment();
  TempDir dir;
  // Its addresses are the unit's; a test binds port 0 and its own socket (flags win).
  const Started run =
      StartAndStop(dir,
                   {"--config", std::string(ZEROD_SOURCE_DIR) + "/deploy/zerod.toml",
                    "--http-listen", "127.0.0.1:0"},
                   {});
  EXPECT_EQ(run.mode, 0660) << run.log;
  EXPECT_THAT(run.log, HasSubstr("stopped"));
}

client::JoinOptions OneRankJob(const std::string& job) {
  client::JoinOptions o;
  o.job_id = job;
  o.world_size = 1;
  o.rank = 0;
  o.host = "test-host";
  o.device = "cpu:0";
  o.layout = plan::SyntheticLayout(1 << 16, DType::kBFloat16, 4);
  o.plan_options.stage = 2;
  return o;
}

TEST(Settings, JsonLogsAreOneObjectPerLineAndAJobsLinesCarryJobRankAndGeneration) {
  ZerodHarness zerod({"--no-auth", "--log-format", "json"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  ASSERT_TRUE(client->Join(OneRankJob("logged"), Scaled(absl::Seconds(30))).ok());
  ASSERT_TRUE(client->Leave("logged", 0).ok());
  ASSERT_EQ(zerod.Terminate(), 0);
  json formed, left;
  const std::vector<std::string> lines = absl::StrSplit(zerod.Log(), '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    ASSERT_TRUE(json::accept(line)) << "not JSON: " << line;
    const json entry = json::parse(line);
    EXPECT_TRUE(entry.contains("time") && entry.contains("level") && entry.contains("message"))
        << line;
    const std::string message = entry["message"];
    if (absl::StrContains(message, "formed")) formed = entry;
    if (absl::StrContains(message, "rank 0 left")) left = entry;
  }
  ASSERT_FALSE(formed.is_null()) << zerod.Log();
  EXPECT_EQ(formed["job"], "logged");
  EXPECT_EQ(formed["rank"], -1);  // about the whole job
  EXPECT_EQ(formed["generation"], 1);
  ASSERT_FALSE(left.is_null()) << zerod.Log();
  EXPECT_EQ(left["job"], "logged");
  EXPECT_EQ(left["rank"], 0);
  EXPECT_GE(left["generation"].get<int64_t>(), 1);
}

}  // namespace
}  // namespace zerod::testing
