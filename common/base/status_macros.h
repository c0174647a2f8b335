// Early-return helpers for absl::Status / absl::StatusOr (abseil 20220623 has
// no status_macros.h of its own).
#ifndef ZSHARD_COMMON_BASE_STATUS_MACROS_H_
#define ZSHARD_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ZS_CONCAT_INNER_(a, b) a##b
#define ZS_CONCAT_(a, b) ZS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define ZS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status zs_status_ = (expr);      \
    if (!zs_status_.ok()) return zs_status_; \
  } while (0)

// `lhs = value of expr`, or returns its error status.
#define ZS_ASSIGN_OR_RETURN(lhs, expr) \
  ZS_ASSIGN_OR_RETURN_IMPL_(ZS_CONCAT_(zs_statusor_, __LINE__), lhs, expr)

#define ZS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // ZSHARD_COMMON_BASE_STATUS_MACROS_H_
