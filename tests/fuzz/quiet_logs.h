#ifndef ZEROD_TESTS_FUZZ_QUIET_LOGS_H_
#define ZEROD_TESTS_FUZZ_QUIET_LOGS_H_

// Protobuf logs every string field with invalid UTF-8 it refuses to parse: with fuzzed bytes that
// is most inputs, and the lines would bury the one report that matters.

#include <google/protobuf/stubs/logging.h>

namespace zerod::fuzz {

inline void QuietProtobufLogs() { google::protobuf::SetLogHandler(nullptr); }

}  // namespace zerod::fuzz

#endif  // ZEROD_TESTS_FUZZ_QUIET_LOGS_H_
