// CUDA kernels of the ragged-batch ops: one launch per batch of images of different sizes packed
// into one buffer (ragged_view in ../common.h), one thread per output pixel (all channels), the same
// per-pixel functions as the CPU kernels. A sample whose index entry lies outside the buffer is
// filled, never read (the Python wrapper rejects such input before the launch).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../checks.h"
#include "../common.h"
#include "launch.cuh"

namespace gpu_ops {
namespace {

template <typename out_t>
__global__ void __launch_bounds__(cuda::kThreads)
    rcmn_ragged_kernel(const uint8_t* __restrict__ src, int64_t numel,
                       const int64_t* __restrict__ index, const int64_t* __restrict__ boxes,
                       const int64_t* __restrict__ sizes, const bool* __restrict__ flip,
                       const float* __restrict__ mean, const float* __restrict__ stdv,
                       out_t* __restrict__ dst, int64_t C, bool channels_first, int64_t out_h,
                       int64_t out_w, bool antialias, float fill, int64_t total) {
  const int64_t plane = out_h * out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / plane;
    const int64_t p = i - b * plane;
    const int64_t y = p / out_w, x = p - (p / out_w) * out_w;
    out_t* d = dst + b * C * plane + p;
    const RaggedView v = ragged_view(index, b, C, channels_first, numel);
    const int64_t rh = sizes[2 * b] < out_h ? sizes[2 * b] : out_h;
    const int64_t rw = sizes[2 * b + 1] < out_w ? sizes[2 * b + 1] : out_w;
    if (!v.ok || y >= rh || x >= rw) {
      for (int64_t c = 0; c < C; ++c) d[c * plane] = static_cast<out_t>(fill);
      continue;
    }
    const Box box = clip_box(boxes + 4 * b, v.H, v.W);
    const int64_t xs = flip[b] ? rw - 1 - x : x;
    const uint8_t* s = src + v.offset + box.top * v.sy + box.left * v.sx;
    if (C <= kPixelChannels) {  // all channels of the pixel at once (the same sums)
      float r[kPixelChannels];
      resample_pixel<uint8_t, float>(s, v.sy, v.sx, v.sc, C, box.height, box.width, rh, rw, y, xs,
                                     false, antialias, r);
#pragma unroll
      for (int c = 0; c < kPixelChannels; ++c) {
        if (c < C) d[c * plane] = static_cast<out_t>((r[c] - mean[c]) * (1.f / stdv[c]));
      }
      continue;
    }
    for (int64_t c = 0; c < C; ++c) {
      const float r = resample_at<uint8_t, float>(s + c * v.sc, v.sy, v.sx, box.height, box.width,
                                                  rh, rw, y, xs, false, antialias);
      d[c * plane] = static_cast<out_t>((r - mean[c]) * (1.f / stdv[c]));
    }
  }
}

template <typename out_t>
__global__ void __launch_bounds__(cuda::kThreads)
    cmn_ragged_kernel(const uint8_t* __restrict__ src, int64_t numel,
                      const int64_t* __restrict__ index, const int64_t* __restrict__ crop,
                      const bool* __restrict__ flip, const float* __restrict__ mean,
                      const float* __restrict__ stdv, out_t* __restrict__ dst, int64_t C,
                      bool channels_first, int64_t out_h, int64_t out_w, int64_t Hp, int64_t Wp,
                      float fill, int64_t total) {
  const int64_t plane = Hp * Wp;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / plane;
    const int64_t p = i - b * plane;
    const int64_t y = p / Wp, x = p - (p / Wp) * Wp;
    out_t* d = dst + b * C * plane + p;
    const RaggedView v = ragged_view(index, b, C, channels_first, numel);
    const int64_t sy = crop[2 * b] + y;
    const int64_t sx = crop[2 * b + 1] + (flip[b] ? out_w - 1 - x : x);
    const bool ok = v.ok && y < out_h && x < out_w && sy >= 0 && sy < v.H && sx >= 0 && sx < v.W;
    const uint8_t* s = src + v.offset + (ok ? sy * v.sy + sx * v.sx : 0);
    for (int64_t c = 0; c < C; ++c) {
      d[c * plane] = ok ? static_cast<out_t>((static_cast<float>(s[c * v.sc]) - mean[c]) *
                                             (1.f / stdv[c]))
                        : static_cast<out_t>(fill);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads)
    resize_ragged_kernel(const T* __restrict__ src, int64_t numel,
                         const int64_t* __restrict__ index, T* __restrict__ dst, int64_t C,
                         bool channels_first, int64_t out_h, int64_t out_w, bool area,
                         bool antialias, int64_t total) {
  using A = acc_t<T>;
  const int64_t plane = out_h * out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / plane;
    const int64_t p = i - b * plane;
    const int64_t y = p / out_w, x = p - (p / out_w) * out_w;
    T* d = dst + b * C * plane + p;
    const RaggedView v = ragged_view(index, b, C, channels_first, numel);
    if (v.ok && C <= kPixelChannels) {  // all channels of the pixel at once (the same sums)
      A r[kPixelChannels];
      resample_pixel<T, A>(src + v.offset, v.sy, v.sx, v.sc, C, v.H, v.W, out_h, out_w, y, x, area,
                           antialias, r);
#pragma unroll
      for (int c = 0; c < kPixelChannels; ++c) {
        if (c < C) d[c * plane] = to_out<T>(r[c]);
      }
      continue;
    }
    for (int64_t c = 0; c < C; ++c) {
      d[c * plane] = v.ok ? to_out<T>(resample_at<T, A>(src + v.offset + c * v.sc, v.sy, v.sx,
                                                        v.H, v.W, out_h, out_w, y, x, area,
                                                        antialias))
                          : T(0);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads)
    warp_ragged_kernel(const T* __restrict__ src, int64_t numel, const int64_t* __restrict__ index,
                       const double* __restrict__ matrix, T* __restrict__ dst, int64_t C,
                       bool channels_first, int64_t out_h, int64_t out_w, bool nearest, T fill,
                       int64_t total) {
  const int64_t plane = out_h * out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / plane;
    const int64_t p = i - b * plane;
    const int64_t y = p / out_w, x = p - (p / out_w) * out_w;
    T* d = dst + b * C * plane + p;
    const RaggedView v = ragged_view(index, b, C, channels_first, numel);
    const WarpCoord wc = warp_coord(matrix + 6 * b, x, y, nearest);
    for (int64_t c = 0; c < C; ++c) {
      d[c * plane] = v.ok ? warp_sample_strided<T>(src + v.offset + c * v.sc, v.H, v.W, v.sy,
                                                   v.sx, wc, nearest, fill)
                          : fill;
    }
  }
}

at::Tensor rcmn_ragged_cuda(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                            bool channels_first, const at::Tensor& boxes_,
                            const at::Tensor& sizes_, const at::Tensor& flip_,
                            const at::Tensor& mean_, const at::Tensor& std_, int64_t out_h,
                            int64_t out_w, at::ScalarType out_dtype, bool antialias,
                            double fill) {
  const char* op = "resized_crop_mirror_normalize_ragged";
  check_ragged(op, data_, index_, C, true);
  check_ragged_per_sample(op, index_, boxes_, "boxes", 4, at::kLong);
  check_ragged_per_sample(op, index_, sizes_, "sizes", 2, at::kLong);
  check_ragged_per_sample(op, index_, flip_, "flip", 0, at::kBool);
  check_ragged_norm(op, data_, mean_, std_, C, out_h, out_w, out_dtype);
  const c10::cuda::CUDAGuard guard(data_.device());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const at::Tensor boxes = boxes_.contiguous(), sizes = sizes_.contiguous();
  const at::Tensor flip = flip_.contiguous(), mean = mean_.contiguous(), stdv = std_.contiguous();
  const int64_t B = index.size(0);
  at::Tensor out = at::empty({B, C, out_h, out_w}, data.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const int64_t total = B * out_h * out_w;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "rcmn_ragged_cuda", [&] {
    rcmn_ragged_kernel<scalar_t><<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
        data.const_data_ptr<uint8_t>(), data.numel(), index.const_data_ptr<int64_t>(),
        boxes.const_data_ptr<int64_t>(), sizes.const_data_ptr<int64_t>(),
        flip.const_data_ptr<bool>(), mean.const_data_ptr<float>(), stdv.const_data_ptr<float>(),
        out.mutable_data_ptr<scalar_t>(), C, channels_first, out_h, out_w, antialias,
        static_cast<float>(fill), total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor cmn_ragged_cuda(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                           bool channels_first, const at::Tensor& crop_, const at::Tensor& flip_,
                           const at::Tensor& mean_, const at::Tensor& std_, int64_t out_h,
                           int64_t out_w, at::ScalarType out_dtype, int64_t pad_multiple,
                           double fill) {
  const char* op = "crop_mirror_normalize_ragged";
  check_ragged(op, data_, index_, C, true);
  check_ragged_per_sample(op, index_, crop_, "crop", 2, at::kLong);
  check_ragged_per_sample(op, index_, flip_, "flip", 0, at::kBool);
  check_ragged_norm(op, data_, mean_, std_, C, out_h, out_w, out_dtype);
  TORCH_CHECK(pad_multiple >= 1, "gpu_ops.", op, ": expected pad_multiple >= 1, got ", pad_multiple);
  const c10::cuda::CUDAGuard guard(data_.device());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const at::Tensor crop = crop_.contiguous(), flip = flip_.contiguous();
  const at::Tensor mean = mean_.contiguous(), stdv = std_.contiguous();
  const int64_t B = index.size(0);
  const int64_t Hp = round_up(out_h, pad_multiple), Wp = round_up(out_w, pad_multiple);
  at::Tensor out = at::empty({B, C, Hp, Wp}, data.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const int64_t total = B * Hp * Wp;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "cmn_ragged_cuda", [&] {
    cmn_ragged_kernel<scalar_t><<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
        data.const_data_ptr<uint8_t>(), data.numel(), index.const_data_ptr<int64_t>(),
        crop.const_data_ptr<int64_t>(), flip.const_data_ptr<bool>(), mean.const_data_ptr<float>(),
        stdv.const_data_ptr<float>(), out.mutable_data_ptr<scalar_t>(), C, channels_first, out_h,
        out_w, Hp, Wp, static_cast<float>(fill), total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor resize_ragged_cuda(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                              bool channels_first, int64_t out_h, int64_t out_w, int64_t mode,
                              bool antialias) {
  check_ragged("resize_ragged", data_, index_, C, false);
  TORCH_CHECK(mode == 0 || mode == 1, "gpu_ops.resize_ragged: expected mode 0 (bilinear) or 1 (area), got ", mode);
  check_out_size("resize_ragged", out_h, out_w);
  const c10::cuda::CUDAGuard guard(data_.device());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const int64_t B = index.size(0);
  at::Tensor out = at::empty({B, C, out_h, out_w}, data.options());
  if (out.numel() == 0) return out;
  const int64_t total = B * out_h * out_w;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, data.scalar_type(),
                                  "resize_ragged_cuda", [&] {
    resize_ragged_kernel<scalar_t><<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
        data.const_data_ptr<scalar_t>(), data.numel(), index.const_data_ptr<int64_t>(),
        out.mutable_data_ptr<scalar_t>(), C, channels_first, out_h, out_w, mode == kResizeArea,
        antialias, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor warp_affine_ragged_cuda(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                                   bool channels_first, const at::Tensor& matrix_, int64_t out_h,
                                   int64_t out_w, int64_t interpolation, double fill) {
  check_ragged("warp_affine_ragged", data_, index_, C, false);
  TORCH_CHECK(matrix_.device() == data_.device() && matrix_.dim() == 3 &&
                  matrix_.size(0) == index_.size(0) && matrix_.size(1) == 2 &&
                  matrix_.size(2) == 3 && matrix_.scalar_type() == at::kDouble,
              "gpu_ops.warp_affine_ragged: expected matrix as float64 [", index_.size(0),
              ", 2, 3] on ", data_.device(), ", got ", matrix_.scalar_type(), " ",
              matrix_.sizes(), " on ", matrix_.device());
  TORCH_CHECK(interpolation == 0 || interpolation == 1,
              "gpu_ops.warp_affine_ragged: expected interpolation 0 (nearest) or 1 (bilinear), got ",
              interpolation);
  check_out_size("warp_affine_ragged", out_h, out_w);
  const c10::cuda::CUDAGuard guard(data_.device());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const at::Tensor matrix = matrix_.contiguous();
  const int64_t B = index.size(0);
  at::Tensor out = at::empty({B, C, out_h, out_w}, data.options());
  if (out.numel() == 0) return out;
  const int64_t total = B * out_h * out_w;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, data.scalar_type(),
                                  "warp_affine_ragged_cuda", [&] {
    warp_ragged_kernel<scalar_t><<<cuda::num_blocks(total), cuda::kThreads, 0, stream>>>(
        data.const_data_ptr<scalar_t>(), data.numel(), index.const_data_ptr<int64_t>(),
        matrix.const_data_ptr<double>(), out.mutable_data_ptr<scalar_t>(), C, channels_first,
        out_h, out_w, interpolation == kNearest, fill_as<scalar_t>(fill), total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m) {
  m.impl("resized_crop_mirror_normalize_ragged", &rcmn_ragged_cuda);
  m.impl("crop_mirror_normalize_ragged", &cmn_ragged_cuda);
  m.impl("resize_ragged", &resize_ragged_cuda);
  m.impl("warp_affine_ragged", &warp_affine_ragged_cuda);
}

}  // namespace gpu_ops
