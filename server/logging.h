#ifndef ZEROD_SERVER_LOGGING_H_
#define ZEROD_SERVER_LOGGING_H_

// Named spdlog loggers, one per component of the daemon, writing through one shared sink: stderr
// by default, or a file that SIGHUP reopens (ConfigureLogs, ReopenLogs). Lines are text or one
// JSON object per line (--log-format json).
//
// A line about a job goes through LogAboutJob, so that it names the job, rank and generation: in
// text as a "job J rank R generation G: " prefix, in JSON as the fields job, rank, generation.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "spdlog/spdlog.h"

namespace zerod::server {

// "coordinator", "rpc", "store", "state", "service", "http"; created on first use.
std::shared_ptr<spdlog::logger> Logger(const std::string& name);

// "trace", "debug", "info", "warn", "error", "off"; false for an unknown level.
bool SetLogLevel(const std::string& level);

enum class LogFormat { kText, kJson };

struct LogOptions {
  LogFormat format = LogFormat::kText;
  std::string file;  // empty: stderr
};

// Chooses the format and the destination of every logger, existing and future. Call it before
// other threads log (at start). An unopenable file is an error naming it; nothing changes then.
[[nodiscard]] absl::Status ConfigureLogs(const LogOptions& options);

// Opens the log file again by its name (after logrotate moved it away): new lines go to the new
// file. A no-op when logging to stderr; when the file cannot be opened, lines keep going to the
// old one and the error says why.
[[nodiscard]] absl::Status ReopenLogs();

// The job a line is about. rank and generation are -1 when the line is about the whole job, or
// the generation is not known.
struct JobFields {
  std::string_view job;
  int64_t rank = -1;
  int64_t generation = -1;
};

namespace internal {
// The fields of the line being formatted on this thread (spdlog formats on the caller's thread).
class ScopedJobFields {
 public:
  explicit ScopedJobFields(const JobFields& fields);
  ~ScopedJobFields();
  ScopedJobFields(const ScopedJobFields&) = delete;
  ScopedJobFields& operator=(const ScopedJobFields&) = delete;

 private:
  const JobFields* previous_;
};
}  // namespace internal

template <typename... Args>
void LogAboutJob(spdlog::logger& logger, spdlog::level::level_enum level, const JobFields& job,
                 spdlog::format_string_t<Args...> format, Args&&... args) {
  if (!logger.should_log(level)) return;
  internal::ScopedJobFields scope(job);
  logger.log(level, format, std::forward<Args>(args)...);
}

}  // namespace zerod::server

#endif  // ZEROD_SERVER_LOGGING_H_
