// Entries for the negotiation's tests (negotiation_test.cc, round_cache_test.cc).
#ifndef HYBRIDPS_TESTS_UNIT_NEGOTIATION_TEST_UTIL_H_
#define HYBRIDPS_TESTS_UNIT_NEGOTIATION_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/node/negotiation.h"

namespace hybridps::negotiation {

// An action's entry indices, comparable with a std::vector.
inline std::vector<size_t> Indices(const Action& a) {
  return {a.entries.begin(), a.entries.end()};
}

inline Entry PushPull(const std::string& name, uint64_t count,
                      DType dtype = DType::kFloat32, int priority = 0,
                      uint32_t occurrence = 0) {
  Entry e;
  e.name = name;
  e.count = count;
  e.dtype = dtype;
  e.priority = priority;
  e.occurrence = occurrence;
  return e;
}

inline Entry Bcast(const std::string& name, uint64_t count, int root) {
  Entry e = PushPull(name, count);
  e.kind = OpKind::kBroadcast;
  e.root = root;
  return e;
}

// One entry's fixed part on the wire (its name and shape follow).
inline constexpr size_t kEntryBytesForTest = 56;

}  // namespace hybridps::negotiation

#endif  // HYBRIDPS_TESTS_UNIT_NEGOTIATION_TEST_UTIL_H_
