// CUDA kernels for gpu_ops::adjust_color: a reduction for the per-image grey mean (contrast needs
// it), then one elementwise pass doing brightness, contrast, saturation and hue (../common.h).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "../checks.h"
#include "../common.h"
#include "launch.cuh"

namespace gpu_ops {
namespace {

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads)
    grey_sum_kernel(const T* __restrict__ src, const float* __restrict__ bf,
                    double* __restrict__ sums, int64_t B, int64_t plane, float in_div) {
  __shared__ double warp_sums[cuda::kThreads / 32];
  for (int64_t b = blockIdx.y; b < B; b += gridDim.y) {
    const T* s = src + b * 3 * plane;
    const float f = bf[b];
    double acc = 0.0;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < plane;
         i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
      const float r = clamp01(to_float(s[i]) / in_div * f);
      const float g = clamp01(to_float(s[plane + i]) / in_div * f);
      const float bl = clamp01(to_float(s[2 * plane + i]) / in_div * f);
      acc += gray(r, g, bl);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < cuda::kThreads / 32 ? warp_sums[lane] : 0.0;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
      if (lane == 0) atomicAdd(sums + b, acc);
    }
    __syncthreads();  // warp_sums is reused by the next image
  }
}

template <typename T, typename index_t>
__global__ void __launch_bounds__(cuda::kThreads)
    adjust_color_kernel(const T* __restrict__ src, T* __restrict__ dst,
                        const float* __restrict__ bf, const float* __restrict__ cf,
                        const float* __restrict__ sf, const float* __restrict__ hf,
                        const double* __restrict__ sums, index_t plane, index_t total,
                        float in_div) {
  const index_t stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const index_t b = i / plane;
    const index_t p = i - b * plane;
    const int64_t base = static_cast<int64_t>(b) * 3 * plane + p;
    const float mean = static_cast<float>(sums[b] / static_cast<double>(plane));
    float r = to_float(src[base]) / in_div;
    float g = to_float(src[base + plane]) / in_div;
    float bl = to_float(src[base + 2 * static_cast<int64_t>(plane)]) / in_div;
    color_pixel(r, g, bl, bf[b], cf[b], sf[b], hf[b], mean);
    dst[base] = to_out<T, float>(r * in_div);
    dst[base + plane] = to_out<T, float>(g * in_div);
    dst[base + 2 * static_cast<int64_t>(plane)] = to_out<T, float>(bl * in_div);
  }
}

at::Tensor adjust_color_cuda(const at::Tensor& input_, const at::Tensor& brightness_,
                             const at::Tensor& contrast_, const at::Tensor& saturation_,
                             const at::Tensor& hue_) {
  check_adjust_color(input_, brightness_, contrast_, saturation_, hue_);
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous();
  const at::Tensor bt = brightness_.contiguous(), ct = contrast_.contiguous();
  const at::Tensor st = saturation_.contiguous(), ht = hue_.contiguous();
  const int64_t B = input.size(0), H = input.size(2), W = input.size(3);
  const int64_t plane = H * W;
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  at::Tensor sums = at::zeros({B}, input.options().dtype(at::kDouble));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t total = B * plane;
  AT_DISPATCH_FLOATING_TYPES_AND3(
      at::kByte, at::kHalf, at::kBFloat16, input.scalar_type(), "adjust_color_cuda", [&] {
        const float in_div = std::is_same<scalar_t, uint8_t>::value ? 255.f : 1.f;
        // About 4 blocks per SM in all; each block sums a strided share of one image.
        const int64_t per_image = std::max<int64_t>(
            1, std::min<int64_t>((plane + cuda::kThreads - 1) / cuda::kThreads,
                                 (528 + B - 1) / B));
        const dim3 grid(static_cast<unsigned int>(per_image),
                        static_cast<unsigned int>(std::min<int64_t>(B, 65535)));
        grey_sum_kernel<scalar_t><<<grid, cuda::kThreads, 0, stream>>>(
            input.const_data_ptr<scalar_t>(), bt.const_data_ptr<float>(),
            sums.mutable_data_ptr<double>(), B, plane, in_div);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (cuda::fits_int32(input.numel())) {
          adjust_color_kernel<scalar_t, int32_t>
              <<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
                  input.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
                  bt.const_data_ptr<float>(), ct.const_data_ptr<float>(),
                  st.const_data_ptr<float>(), ht.const_data_ptr<float>(),
                  sums.const_data_ptr<double>(), plane, total, in_div);
        } else {
          adjust_color_kernel<scalar_t, int64_t>
              <<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
                  input.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
                  bt.const_data_ptr<float>(), ct.const_data_ptr<float>(),
                  st.const_data_ptr<float>(), ht.const_data_ptr<float>(),
                  sums.const_data_ptr<double>(), plane, total, in_div);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m) {
  m.impl("adjust_color", &adjust_color_cuda);
}

}  // namespace gpu_ops
