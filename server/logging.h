#ifndef ZEROD_SERVER_LOGGING_H_
#define ZEROD_SERVER_LOGGING_H_

// Named spdlog loggers, one per component of the daemon.

#include <memory>
#include <string>

#include "spdlog/spdlog.h"

namespace zerod::server {

// "coordinator", "rpc", "store" or "state"; created on first use, sharing one stderr sink.
std::shared_ptr<spdlog::logger> Logger(const std::string& name);

// "trace", "debug", "info", "warn", "error", "off"; false for an unknown level.
bool SetLogLevel(const std::string& level);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_LOGGING_H_
