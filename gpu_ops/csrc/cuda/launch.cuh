// Launch helpers shared by the CUDA kernels.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

namespace gpu_ops {
namespace cuda {

constexpr int kThreads = 256;

// Enough blocks for one element per thread, capped; the kernels use grid-stride loops.
inline unsigned int num_blocks(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 1 << 30)));
}

// Kernels index with int32 when every index fits with room for the grid-stride increment (integer
// division is several times cheaper), and with int64 otherwise.
inline bool fits_int32(int64_t n) {
  return n < (int64_t{1} << 30);
}

}  // namespace cuda
}  // namespace gpu_ops
