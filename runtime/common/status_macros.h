#ifndef ZEROD_RUNTIME_COMMON_STATUS_MACROS_H_
#define ZEROD_RUNTIME_COMMON_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr. Our abseil (2022-06) ships none.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ZEROD_INTERNAL_CONCAT_INNER(a, b) a##b
#define ZEROD_INTERNAL_CONCAT(a, b) ZEROD_INTERNAL_CONCAT_INNER(a, b)

// ZEROD_RETURN_IF_ERROR(expr): returns the status of `expr` from the enclosing function when it is
// not OK.
#define ZEROD_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status zerod_status_ = (expr);         \
    if (!zerod_status_.ok()) return zerod_status_; \
  } while (false)

// ZEROD_ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration: `auto x`).
#define ZEROD_ASSIGN_OR_RETURN(lhs, expr) \
  ZEROD_INTERNAL_ASSIGN_OR_RETURN(ZEROD_INTERNAL_CONCAT(zerod_statusor_, __LINE__), lhs, expr)

#define ZEROD_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

#endif  // ZEROD_RUNTIME_COMMON_STATUS_MACROS_H_
