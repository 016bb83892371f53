#include "runtime/checkpoint/internal/protocol_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/common/status_macros.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace zerod::checkpoint::internal {
namespace {

absl::Duration Remaining(absl::Time deadline) {
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

}  // namespace

spdlog::logger& Log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> found = spdlog::get("checkpoint");
    return found != nullptr ? found : spdlog::stderr_color_mt("checkpoint");
  }();
  return *logger;
}

std::string EncodeStatus(const absl::Status& status, const std::string& payload) {
  if (status.ok()) return "OK\n" + payload;
  return absl::StrCat("ERR ", static_cast<int>(status.code()), IsDamage(status) ? " damage" : "",
                      "\n", status.message());
}

absl::StatusOr<std::string> DecodeStatus(const std::string& value, const std::string& key) {
  const size_t newline = value.find('\n');
  const std::string head = value.substr(0, newline);
  const std::string rest = newline == std::string::npos ? "" : value.substr(newline + 1);
  if (head == "OK") return rest;
  int code = 0;
  absl::string_view code_text = head;
  if (!absl::ConsumePrefix(&code_text, "ERR ")) code_text = "";
  const bool damage = absl::ConsumeSuffix(&code_text, " damage");
  if (absl::SimpleAtoi(code_text, &code) && code > 0 && code <= 16) {
    absl::Status s(static_cast<absl::StatusCode>(code), rest);
    return damage ? Damage(std::move(s)) : s;
  }
  return absl::InternalError(absl::StrCat("checkpoint: store key ", key, " holds '",
                                          value.substr(0, 64), "', not a status"));
}

absl::StatusOr<int64_t> NextCall(comm::Store& store, int64_t rank) {
  return store.Add(absl::StrCat("ckpt/calls/", rank), 1);
}

absl::Status RememberKeys(comm::Store& store, int64_t call, const std::vector<std::string>& keys) {
  return store.Set(absl::StrCat("ckpt/keys/", call), absl::StrJoin(keys, "\n"));
}

void ForgetKeys(comm::Store& store, int64_t call) {
  const std::string list_key = absl::StrCat("ckpt/keys/", call);
  absl::StatusOr<std::string> list = store.Get(list_key, absl::ZeroDuration());
  if (!list.ok()) return;
  for (absl::string_view key : absl::StrSplit(*list, '\n', absl::SkipEmpty())) {
    (void)store.Delete(std::string(key));
  }
  (void)store.Delete(list_key);
}

std::vector<std::string> RankKeys(const std::string& prefix, int64_t world) {
  std::vector<std::string> keys;
  for (int64_t r = 0; r < world; ++r) keys.push_back(absl::StrCat(prefix, r));
  return keys;
}

absl::StatusOr<std::string> Await(comm::Store& store, const std::string& key, absl::Time deadline,
                                  const std::string& waiting_for, absl::Duration timeout) {
  absl::StatusOr<std::string> value = store.Get(key, Remaining(deadline));
  if (value.ok()) return value;
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(absl::StrCat("checkpoint: ", waiting_for, " within ",
                                                    absl::FormatDuration(timeout), " (key ", key,
                                                    ")"));
  }
  return value.status();
}

absl::StatusOr<std::string> SetFirst(comm::Store& store, const std::string& key,
                                     const std::string& value) {
  return store.CompareSet(key, std::nullopt, value);
}

absl::Status Named(const absl::Status& s, const std::string& context) {
  absl::Status named(s.code(), absl::StrCat(context, s.message()));
  s.ForEachPayload(
      [&](absl::string_view type, const absl::Cord& payload) { named.SetPayload(type, payload); });
  return named;
}

absl::Status Agree(comm::Store& store, const std::string& prefix, int64_t rank, int64_t world,
                   absl::Status mine, absl::Time deadline, absl::Duration timeout,
                   const std::string& what) {
  if (!mine.ok() && rank != 0) mine = Named(mine, absl::StrCat("rank ", rank, ": "));
  ZEROD_RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, rank), EncodeStatus(mine)));
  for (int64_t r = 0; r < world; ++r) {
    const std::string rank_key = absl::StrCat(prefix, r);
    ZEROD_ASSIGN_OR_RETURN(
        std::string verdict,
        Await(store, rank_key, deadline, absl::StrCat("rank ", r, " did not ", what), timeout));
    ZEROD_RETURN_IF_ERROR(DecodeStatus(verdict, rank_key).status());
  }
  return absl::OkStatus();
}

}  // namespace zerod::checkpoint::internal
