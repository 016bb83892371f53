#include "tests/integration/other_user.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/util/subprocess.h"

namespace zerod::testing {

std::vector<std::string> WithoutThisEnvironment(bool as_nobody) {
  std::vector<std::string> argv;
  if (as_nobody) argv = {"/usr/sbin/runuser", "-u", "nobody", "--"};
  argv.insert(argv.end(), {"/usr/bin/env", "-i", "PATH=/usr/bin:/bin"});
  if (const char* config = std::getenv("XDG_CONFIG_HOME"); config != nullptr && !as_nobody) {
    argv.push_back(absl::StrCat("XDG_CONFIG_HOME=", config));
  }
  for (const char* name :
       {"TSAN_OPTIONS", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "ZEROD_TEST_TIME_SCALE"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      argv.push_back(absl::StrCat(name, "=", value));
    }
  }
  return argv;
}

nlohmann::json RunProbe(bool as_nobody, const std::string& program,
                        const std::vector<std::string>& args) {
  std::vector<std::string> argv = WithoutThisEnvironment(as_nobody);
  argv.push_back(program);
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = RunProcess(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const size_t brace = r.out.rfind('{');
  if (brace == std::string::npos) {
    ADD_FAILURE() << "no JSON from " << program << ": " << r.out << r.err;
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(r.out.substr(brace));
}

client::JoinOptions OneRankJob(const std::string& job, const std::string& host) {
  client::JoinOptions join;
  join.job_id = job;
  join.world_size = 1;
  join.rank = 0;
  join.host = host;
  join.device = "cpu";
  join.layout = plan::SyntheticLayout(1000, DType::kBFloat16, 8);
  return join;
}

}  // namespace zerod::testing
