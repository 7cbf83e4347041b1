// A stable 64-bit hash of a string (FNV-1a): the same value in every process, build and
// run, for names that several processes must derive alike (tensor keys, shared-memory
// segment names; hybridps/launcher/shm.py computes the same in Python).
#ifndef HYBRIDPS_COMMON_HASH_H_
#define HYBRIDPS_COMMON_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace hybridps {

inline uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_HASH_H_
