#include "client/c_api/internal/c_api_support.h"

#include <cstdlib>
#include <cstring>

namespace zerod::c_api::internal {

std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

int Fail(const absl::Status& status) {
  LastError() = std::string(status.message());
  return static_cast<int>(status.code());
}

int Report(const absl::Status& status) {
  if (status.ok()) {
    LastError().clear();
    return 0;
  }
  return Fail(status);
}

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status NeedEngine(const zerod_session* s) {
  if (s == nullptr) return Invalid("no session (NULL)");
  if (s->engine == nullptr) {
    return absl::FailedPreconditionError("the session has no engine yet (zerod_engine_create)");
  }
  return absl::OkStatus();
}

absl::Status Synced(zerod_session* s, absl::Status status) {
  if (!status.ok()) return status;
  auto ops = s->session->device_ops();
  return ops == nullptr ? absl::OkStatus() : ops->Synchronize();
}

int ReturnJson(const nlohmann::json& value, char** out) {
  if (out == nullptr) return Fail(Invalid("no output pointer"));
  const std::string text = value.dump();
  *out = static_cast<char*>(std::malloc(text.size() + 1));
  if (*out == nullptr) return Fail(absl::ResourceExhaustedError("out of memory"));
  std::memcpy(*out, text.c_str(), text.size() + 1);
  return Report(absl::OkStatus());
}

}  // namespace zerod::c_api::internal
