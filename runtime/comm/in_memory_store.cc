#include "runtime/comm/in_memory_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zerod::comm {

absl::StatusOr<int64_t> ParseStoredInt(const std::string& key, const std::string& text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("store key '", key, "' holds '", text.substr(0, 32), "', not an integer"));
  }
  return value;
}

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  MutexLock lock(&mu_);
  const auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
  if (!mu_.AwaitWithTimeout(present, timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key '", key, "' was not set within ", absl::FormatDuration(timeout)));
  }
  return values_.at(key);
}

absl::StatusOr<int64_t> InMemoryStore::Add(const std::string& key, int64_t delta) {
  MutexLock lock(&mu_);
  int64_t value = 0;
  if (auto it = values_.find(key); it != values_.end()) {
    auto parsed = ParseStoredInt(key, it->second);
    if (!parsed.ok()) return parsed.status();
    value = *parsed;
  }
  value += delta;
  values_[key] = absl::StrCat(value);
  return value;
}

absl::StatusOr<std::string> InMemoryStore::CompareSet(const std::string& key,
                                                      const std::optional<std::string>& expected,
                                                      const std::string& desired) {
  MutexLock lock(&mu_);
  auto it = values_.find(key);
  const bool matches =
      expected.has_value() ? (it != values_.end() && it->second == *expected) : it == values_.end();
  if (matches) {
    values_[key] = desired;
    return desired;
  }
  return it == values_.end() ? std::string() : it->second;
}

absl::StatusOr<bool> InMemoryStore::Delete(const std::string& key) {
  MutexLock lock(&mu_);
  return values_.erase(key) > 0;
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  MutexLock lock(&mu_);
  const auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& k : keys) {
      if (!values_.contains(k)) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithTimeout(all_present, timeout)) {
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      if (!values_.contains(k)) missing.push_back(k);
    }
    return absl::DeadlineExceededError(absl::StrCat("store keys not set within ",
                                                    absl::FormatDuration(timeout), ": ",
                                                    absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace zerod::comm
