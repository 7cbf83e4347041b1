// Status helpers. abseil 20220623 has Status/StatusOr but no RETURN_IF_ERROR or
// ASSIGN_OR_RETURN; these are ours. Use absl::Status at every boundary where the network,
// a peer or the user can make something fail; CHECK only the program's own invariants.
#ifndef HYBRIDPS_COMMON_STATUS_H_
#define HYBRIDPS_COMMON_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HYBRIDPS_CONCAT_INNER_(a, b) a##b
#define HYBRIDPS_CONCAT_(a, b) HYBRIDPS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status _hps_status = (expr);       \
    if (!_hps_status.ok()) return _hps_status; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, Foo()) declares/assigns x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  HYBRIDPS_ASSIGN_OR_RETURN_IMPL_(HYBRIDPS_CONCAT_(_hps_statusor_, __LINE__), lhs, expr)
#define HYBRIDPS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

#endif  // HYBRIDPS_COMMON_STATUS_H_
