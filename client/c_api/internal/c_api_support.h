#ifndef ZEROD_CLIENT_C_API_INTERNAL_C_API_SUPPORT_H_
#define ZEROD_CLIENT_C_API_INTERNAL_C_API_SUPPORT_H_

// What the C API's files share: the session handle behind zerod_session*, and the turning of an
// absl::Status into a return code plus this thread's last error message (zerod_c.h).

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/trainer_session.h"
#include "nlohmann/json.hpp"

struct zerod_session {
  std::unique_ptr<zerod::client::TrainerSession> session;
  zerod::engine::ZeroEngine* engine = nullptr;
};

namespace zerod::c_api::internal {

// This thread's last error message (zerod_last_error).
std::string& LastError();
// Records `status` (not OK) as the last error and returns its code.
int Fail(const absl::Status& status);
// 0 (clearing the last error) for OK, else Fail(status).
int Report(const absl::Status& status);
absl::Status Invalid(const std::string& what);
// INVALID_ARGUMENT without a session, FAILED_PRECONDITION before zerod_engine_create.
absl::Status NeedEngine(const zerod_session* s);
// `status`, after the engine's device work is done when it is OK (the caller reads at once).
absl::Status Synced(zerod_session* s, absl::Status status);
// `value` as JSON text in memory the caller frees with zerod_free.
int ReturnJson(const nlohmann::json& value, char** out);

}  // namespace zerod::c_api::internal

#endif  // ZEROD_CLIENT_C_API_INTERNAL_C_API_SUPPORT_H_
