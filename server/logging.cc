#include "server/logging.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <mutex>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "runtime/common/safe_file.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace zerod::server {
namespace internal {
namespace {
thread_local const JobFields* current_job = nullptr;
}  // namespace

ScopedJobFields::ScopedJobFields(const JobFields& fields) : previous_(current_job) {
  current_job = &fields;
}
ScopedJobFields::~ScopedJobFields() { current_job = previous_; }

const JobFields* CurrentJob() { return current_job; }
}  // namespace internal

namespace {

constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %J%v";

// %J: "job J rank R generation G: " on a line about a job, nothing on others.
class JobPrefix final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const JobFields* job = internal::CurrentJob();
    if (job == nullptr) return;
    std::string prefix = "job " + std::string(job->job);
    if (job->rank >= 0) absl::StrAppend(&prefix, " rank ", job->rank);
    if (job->generation >= 0) absl::StrAppend(&prefix, " generation ", job->generation);
    prefix += ": ";
    dest.append(prefix.data(), prefix.data() + prefix.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JobPrefix>();
  }
};

std::unique_ptr<spdlog::formatter> TextFormatter() {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<JobPrefix>('J').set_pattern(kTextPattern);
  return formatter;
}

// One JSON object per line: time (UTC, milliseconds), level, logger, message, and job, rank,
// generation on a line about a job (rank and generation -1 when not applicable).
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line;
    const absl::Time time = absl::FromChrono(msg.time);
    line["time"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
    const auto level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string(level.data(), level.size());
    line["logger"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    line["message"] = std::string(msg.payload.data(), msg.payload.size());
    if (const JobFields* job = internal::CurrentJob()) {
      line["job"] = std::string(job->job);
      line["rank"] = job->rank;
      line["generation"] = job->generation;
    }
    // Bytes that are not UTF-8 (a job id as a client sent it) become U+FFFD, never a broken line.
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

std::unique_ptr<spdlog::formatter> FormatterOf(LogFormat format) {
  if (format == LogFormat::kJson) return std::make_unique<JsonFormatter>();
  return TextFormatter();
}

// A regular file only: a link, a device or a FIFO at the path is refused (never written through,
// never waited on), at start and at every reopen.
absl::StatusOr<int> OpenLogFile(const std::string& path) {
  absl::StatusOr<int> fd = OpenRegularFileForAppend(path, 0640);
  if (!fd.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-file: ", fd.status().message()));
  }
  return fd;
}

// Appends each line to a file with one write(2), unbuffered: a line is on disk (in the page
// cache) when the call returns, and a reopen loses nothing.
class ReopenableFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  ReopenableFileSink(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~ReopenableFileSink() override { close(fd_); }

  absl::Status Reopen() {
    auto fd = OpenLogFile(path_);
    if (!fd.ok()) return fd.status();
    std::lock_guard<std::mutex> lock(mutex_);
    close(fd_);
    fd_ = *fd;
    return absl::OkStatus();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    const char* data = line.data();
    size_t left = line.size();
    while (left > 0) {
      const ssize_t n = write(fd_, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // a full disk: the line is lost, the daemon goes on
      data += n;
      left -= static_cast<size_t>(n);
    }
  }
  void flush_() override {}

 private:
  const std::string path_;
  int fd_;
};

struct LogState {
  std::mutex mu;
  spdlog::sink_ptr sink;
  std::shared_ptr<ReopenableFileSink> file;  // when logging to a file
};

LogState& State() {
  static LogState* state = new LogState();  // never destroyed: loggers log until exit
  return *state;
}

spdlog::sink_ptr SharedSink() {
  LogState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  if (!state.sink) {
    state.sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    state.sink->set_formatter(TextFormatter());
  }
  return state.sink;
}

}  // namespace

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = std::make_shared<spdlog::logger>(name, SharedSink());
  logger->set_level(spdlog::get_level());
  // Two threads may create the same logger at once; the second uses the first's.
  try {
    spdlog::register_logger(logger);
  } catch (const spdlog::spdlog_ex&) {
    if (auto existing = spdlog::get(name)) return existing;
  }
  return logger;
}

bool SetLogLevel(const std::string& level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return false;
  spdlog::set_level(parsed);
  return true;
}

absl::Status ConfigureLogs(const LogOptions& options) {
  spdlog::sink_ptr sink;
  std::shared_ptr<ReopenableFileSink> file;
  if (options.file.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  } else {
    auto fd = OpenLogFile(options.file);
    if (!fd.ok()) return fd.status();
    file = std::make_shared<ReopenableFileSink>(options.file, *fd);
    sink = file;
  }
  sink->set_formatter(FormatterOf(options.format));
  {
    LogState& state = State();
    std::lock_guard<std::mutex> lock(state.mu);
    state.sink = sink;
    state.file = file;
  }
  spdlog::apply_all(
      [&](const std::shared_ptr<spdlog::logger>& logger) { logger->sinks().assign(1, sink); });
  return absl::OkStatus();
}

absl::Status ReopenLogs() {
  std::shared_ptr<ReopenableFileSink> file;
  {
    LogState& state = State();
    std::lock_guard<std::mutex> lock(state.mu);
    file = state.file;
  }
  return file ? file->Reopen() : absl::OkStatus();
}

}  // namespace zerod::server
