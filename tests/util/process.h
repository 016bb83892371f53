#ifndef ZEROD_TESTS_UTIL_PROCESS_H_
#define ZEROD_TESTS_UTIL_PROCESS_H_

// A child process running in the background (a daemon, a rank), its output in a file.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace zerod::testing {

class ChildProcess {
 public:
  // Starts argv[0] with `extra_env` ("NAME=value") added; stdout and stderr go to `log_path`.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path,
               const std::vector<std::string>& extra_env = {});
  ~ChildProcess();  // kills (SIGKILL) and reaps if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal);
  // The exit code (128 + signal when killed), or -1 if still running after Scaled(timeout)
  // (tests/util/test_time.h): `timeout` is how long the wait may take on an idle optimized build.
  int Wait(absl::Duration timeout);
  std::string Output() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string log_path_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_PROCESS_H_
