#include "server/logging.h"

#include "spdlog/sinks/stdout_color_sinks.h"

namespace zerod::server {

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %v");
  logger->set_level(spdlog::get_level());
  return logger;
}

bool SetLogLevel(const std::string& level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return false;
  spdlog::set_level(parsed);
  return true;
}

}  // namespace zerod::server
