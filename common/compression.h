// MXNet's 2-bit gradient compression (kv.set_gradient_compression({'type': '2bit',
// 'threshold': t})), as its kvstore does it: each worker adds its gradient to a residual
// it keeps per tensor partition; an element whose residual reaches +t is sent as +t (bits
// 11), one at -t or below as -t (bits 10), the others as 0 (bits 00), and what was sent
// is taken off the residual, so nothing is lost, only delayed. Four elements per byte,
// the first in the byte's top two bits; the packed size is rounded up to whole floats (16
// elements), as MXNet's. Workers push packed partitions; servers unpack them and sum.
#ifndef HYBRIDPS_COMMON_COMPRESSION_H_
#define HYBRIDPS_COMMON_COMPRESSION_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hybridps {

// The wire values of DataRequest.compression: never renumber.
enum class Compression : uint32_t { kNone = 0, kTwoBit = 1 };

struct GradientCompression {
  Compression type = Compression::kNone;
  float threshold = 0.5f;  // kTwoBit: the value an element is sent as (> 0)
};

// InvalidArgument naming what is wrong, for a threshold that is not finite and positive.
absl::Status CheckGradientCompression(const GradientCompression& c);

// Bytes of `count` packed elements.
size_t TwoBitBytes(size_t count);

// residual[i] += grad[i], then packs what is sent into `out` (TwoBitBytes(count) bytes)
// and takes it off the residual. `grad` may alias nothing else.
void TwoBitQuantize(const float* grad, size_t count, float threshold, float* residual,
                    char* out);

// The values `packed` stands for, into `out` (count floats). InvalidArgument when its size
// is not TwoBitBytes(count) or it uses the unused code 01.
absl::Status TwoBitDequantize(absl::string_view packed, size_t count, float threshold,
                              float* out);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_COMPRESSION_H_
