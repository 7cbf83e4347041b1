// Vectorised element-wise kernels used by the servers (summing pushes) and the workers
// (local reduction). float16 and bfloat16 are accumulated in float32 and rounded once
// per call (to nearest even). Integer sums wrap like the C++ unsigned arithmetic of
// their width (two's complement), never trap.
#ifndef HYBRIDPS_COMMON_REDUCE_H_
#define HYBRIDPS_COMMON_REDUCE_H_

#include <cstddef>

#include "common/dtype.h"

namespace hybridps {

// dst[i] += src[i] for i < count. dst and src must not overlap partially (equal is fine).
void SumInto(DType dtype, void* dst, const void* src, size_t count);

// dst[i] = a[i] + b[i]. Any of the three may alias.
void Sum2(DType dtype, void* dst, const void* a, const void* b, size_t count);

// Name of the instruction set the kernels dispatched to at run time ("avx2", "sse2"...).
const char* ReduceKernelIsa();

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_REDUCE_H_
