// CUDA kernel for gpu_ops::resized_crop_mirror_normalize: one thread per output pixel, all channels;
// per-sample box, flip and windows from ../common.h, so it computes what the CPU kernel computes.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../checks.h"
#include "../common.h"
#include "launch.cuh"

namespace gpu_ops {
namespace {

template <typename out_t, typename index_t>
__global__ void __launch_bounds__(cuda::kThreads)
    rcmn_kernel(const uint8_t* __restrict__ src, const int64_t* __restrict__ boxes,
                const bool* __restrict__ flip, const float* __restrict__ mean,
                const float* __restrict__ stdv, out_t* __restrict__ dst, index_t C, index_t H,
                index_t W, index_t out_h, index_t out_w, index_t Hp, index_t Wp, bool antialias,
                float fill, index_t total) {
  const index_t stride = static_cast<index_t>(blockDim.x) * gridDim.x;
  const int64_t plane = static_cast<int64_t>(Hp) * Wp;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const index_t x = i % Wp;
    const index_t row = i / Wp;
    const index_t y = row % Hp;
    const index_t b = row / Hp;
    out_t* d = dst + static_cast<int64_t>(b) * C * plane + static_cast<int64_t>(y) * Wp + x;
    if (y >= out_h || x >= out_w) {
      for (index_t c = 0; c < C; ++c) d[c * plane] = static_cast<out_t>(fill);
      continue;
    }
    const Box box = clip_box(boxes + 4 * static_cast<int64_t>(b), H, W);
    const index_t xs = flip[b] ? out_w - 1 - x : x;
    const uint8_t* s = src + ((static_cast<int64_t>(b) * H + box.top) * W + box.left) * C;
    const int64_t row_stride = static_cast<int64_t>(W) * C;
    if (is_linear(false, antialias, box.width, out_w) &&
        is_linear(false, antialias, box.height, out_h)) {
      const Lin lx = linear_axis(box.width, out_w, xs);
      const Lin ly = linear_axis(box.height, out_h, y);
      for (index_t c = 0; c < C; ++c) {
        const float r = sample_linear<uint8_t, float>(s + c, row_stride, C, ly, lx);
        d[c * plane] = static_cast<out_t>((r - mean[c]) * (1.f / stdv[c]));
      }
    } else {
      const Axis ax = make_axis(false, antialias, box.width, out_w, xs);
      const Axis ay = make_axis(false, antialias, box.height, out_h, y);
      if (C <= kPixelChannels) {  // all channels of the pixel at once (the same sums)
        float r[kPixelChannels];
        sample_window_pixel<uint8_t, float>(s, row_stride, C, 1, C, ay, ax, r);
#pragma unroll
        for (int c = 0; c < kPixelChannels; ++c) {
          if (c < C) d[c * plane] = static_cast<out_t>((r[c] - mean[c]) * (1.f / stdv[c]));
        }
        continue;
      }
      for (index_t c = 0; c < C; ++c) {
        const float r = sample_window<uint8_t, float>(s + c, row_stride, C, ay, ax);
        d[c * plane] = static_cast<out_t>((r - mean[c]) * (1.f / stdv[c]));
      }
    }
  }
}

at::Tensor resized_crop_mirror_normalize_cuda(const at::Tensor& input_, const at::Tensor& boxes_,
                                              const at::Tensor& flip_, const at::Tensor& mean_,
                                              const at::Tensor& std_, int64_t out_h,
                                              int64_t out_w, at::ScalarType out_dtype,
                                              bool antialias, int64_t pad_multiple, double fill) {
  check_resized_crop_mirror_normalize(input_, boxes_, flip_, mean_, std_, out_h, out_w, out_dtype,
                                      pad_multiple);
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous();
  const at::Tensor boxes = boxes_.contiguous();
  const at::Tensor flip = flip_.contiguous();
  const at::Tensor mean = mean_.contiguous();
  const at::Tensor stdv = std_.contiguous();
  const int64_t B = input.size(0), H = input.size(1), W = input.size(2), C = input.size(3);
  const int64_t Hp = round_up(out_h, pad_multiple), Wp = round_up(out_w, pad_multiple);
  at::Tensor out = at::empty({B, C, Hp, Wp}, input.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const int64_t total = B * Hp * Wp;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool small = cuda::fits_int32(input.numel()) && cuda::fits_int32(out.numel());
  const float f = static_cast<float>(fill);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype,
                                  "resized_crop_mirror_normalize_cuda", [&] {
    if (small) {
      rcmn_kernel<scalar_t, int32_t><<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
          input.const_data_ptr<uint8_t>(), boxes.const_data_ptr<int64_t>(),
          flip.const_data_ptr<bool>(), mean.const_data_ptr<float>(), stdv.const_data_ptr<float>(),
          out.mutable_data_ptr<scalar_t>(), C, H, W, out_h, out_w, Hp, Wp, antialias, f, total);
    } else {
      rcmn_kernel<scalar_t, int64_t><<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
          input.const_data_ptr<uint8_t>(), boxes.const_data_ptr<int64_t>(),
          flip.const_data_ptr<bool>(), mean.const_data_ptr<float>(), stdv.const_data_ptr<float>(),
          out.mutable_data_ptr<scalar_t>(), C, H, W, out_h, out_w, Hp, Wp, antialias, f, total);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m) {
  m.impl("resized_crop_mirror_normalize", &resized_crop_mirror_normalize_cuda);
}

}  // namespace gpu_ops
