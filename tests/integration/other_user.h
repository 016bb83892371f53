#ifndef ZEROD_TESTS_INTEGRATION_OTHER_USER_H_
#define ZEROD_TESTS_INTEGRATION_OTHER_USER_H_

// What the security tests need to act as another Unix user (runuser nobody) or as an outsider:
// a clean command line, a probe's JSON answer, and a job of one rank to attack.

#include <string>
#include <vector>

#include "client/coordinator_client.h"
#include "nlohmann/json.hpp"

namespace zerod::testing {

// The start of a command line that runs its program with nothing of this process's environment
// but PATH, a sanitizer build's options (without them a ThreadSanitizer build's child exits 66
// on a report inside gRPC that the suite's suppressions and log filter would have dropped) and the
// tests' time scale (tests/util/test_time.h), as the user nobody or as this user. As this user it
// keeps the test's config dir (XDG_CONFIG_HOME): else it would look in the user's own, where any
// run outside ctest may have saved a token for a job of the same name.
std::vector<std::string> WithoutThisEnvironment(bool as_nobody);

// Runs `program` (a probe printing one JSON line last) with `args` that way; its JSON, or an empty
// object and a test failure when it printed none or did not exit 0.
nlohmann::json RunProbe(bool as_nobody, const std::string& program,
                        const std::vector<std::string>& args);

// A job of one rank on `host`, with a small synthetic layout: it forms at its first join.
client::JoinOptions OneRankJob(const std::string& job, const std::string& host = "node-a");

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_INTEGRATION_OTHER_USER_H_
