// CUDA kernel for gpu_ops::resize: windows from ../common.h (the same arithmetic as the CPU
// kernel), 4 output columns per thread.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../checks.h"
#include "../common.h"
#include "launch.cuh"

namespace gpu_ops {
namespace {

template <typename T, int N>
struct alignas(N * sizeof(T)) VecN {
  T v[N];
};

// Grid: x over groups of PX output columns, y over output rows b * out_h + y (grid-stride). Each
// thread computes its PX column windows once and reuses them for every channel; with PX > 1 it
// writes each channel's PX values with one vector store when rows are a multiple of PX wide (used
// for uint8, where single-byte stores would waste most of each memory transaction). kLinear gets
// its own instantiation so the 2-tap path has its own, smaller register allocation.
template <typename T, typename index_t, bool kLinear, int PX>
__global__ void __launch_bounds__(cuda::kThreads)
    resize_kernel(const T* __restrict__ src, T* __restrict__ dst, index_t C, index_t H,
                  index_t W, index_t out_h, index_t out_w, bool area, bool antialias,
                  index_t groups_per_row, index_t rows, bool vec_store) {
  using A = acc_t<T>;
  using Ax = typename std::conditional<kLinear, Lin, Axis>::type;
  const index_t g = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups_per_row) return;
  const int64_t plane = static_cast<int64_t>(H) * W;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t x0 = static_cast<int64_t>(g) * PX;
  Ax ax[PX];
#pragma unroll
  for (int k = 0; k < PX; ++k) {
    const int64_t x = x0 + k < out_w ? x0 + k : out_w - 1;  // columns past the row: not stored
    if constexpr (kLinear) {
      ax[k] = linear_axis(W, out_w, x);
    } else {
      ax[k] = make_axis(area, antialias, W, out_w, x);
    }
  }
  for (index_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const index_t b = row / out_h;
    const index_t y = row - b * out_h;
    Ax ay;
    if constexpr (kLinear) {
      ay = linear_axis(H, out_h, y);
    } else {
      ay = make_axis(area, antialias, H, out_h, y);
    }
    const T* s = src + static_cast<int64_t>(b) * C * plane;
    T* d = dst + static_cast<int64_t>(b) * C * out_plane + static_cast<int64_t>(y) * out_w + x0;
    for (index_t c = 0; c < C; ++c) {
      VecN<T, PX> v;
#pragma unroll
      for (int k = 0; k < PX; ++k) {
        if constexpr (kLinear) {
          v.v[k] = to_out<T>(sample_linear<T, A>(s + c * plane, W, 1, ay, ax[k]));
        } else {
          v.v[k] = to_out<T>(sample_window<T, A>(s + c * plane, W, 1, ay, ax[k]));
        }
      }
      T* dc = d + c * out_plane;
      if (PX == 1 || vec_store) {
        *reinterpret_cast<VecN<T, PX>*>(dc) = v;
      } else {
#pragma unroll
        for (int k = 0; k < PX; ++k) {
          if (x0 + k < out_w) dc[k] = v.v[k];
        }
      }
    }
  }
}

template <typename T, typename index_t, int PX>
void launch_resize(const at::Tensor& input, at::Tensor& out, bool area, bool antialias,
                   bool linear, cudaStream_t stream) {
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t out_h = out.size(2), out_w = out.size(3);
  const int64_t groups_per_row = (out_w + PX - 1) / PX;
  const int64_t rows = B * out_h;
  const bool vec_store = out_w % PX == 0;
  const int threads =
      static_cast<int>(std::min<int64_t>(cuda::kThreads, (groups_per_row + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned int>((groups_per_row + threads - 1) / threads),
                  static_cast<unsigned int>(std::min<int64_t>(rows, 65535)));
  const T* in_p = input.const_data_ptr<T>();
  T* out_p = out.mutable_data_ptr<T>();
  if (linear) {
    resize_kernel<T, index_t, true, PX><<<grid, threads, 0, stream>>>(
        in_p, out_p, C, H, W, out_h, out_w, area, antialias, groups_per_row, rows, vec_store);
  } else {
    resize_kernel<T, index_t, false, PX><<<grid, threads, 0, stream>>>(
        in_p, out_p, C, H, W, out_h, out_w, area, antialias, groups_per_row, rows, vec_store);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor resize_cuda(const at::Tensor& input_, int64_t out_h, int64_t out_w, int64_t mode,
                       bool antialias) {
  check_resize(input_, out_h, out_w, mode);
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous();
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  at::Tensor out = at::empty({B, C, out_h, out_w}, input.options());
  if (out.numel() == 0) return out;
  const bool area = mode == kResizeArea;
  const bool linear = is_linear(area, antialias, W, out_w) && is_linear(area, antialias, H, out_h);
  const bool small = cuda::fits_int32(input.numel()) && cuda::fits_int32(out.numel());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND3(
      at::kByte, at::kHalf, at::kBFloat16, input.scalar_type(), "resize_cuda", [&] {
        constexpr int PX = std::is_same<scalar_t, uint8_t>::value ? 4 : 1;
        if (small) {
          launch_resize<scalar_t, int32_t, PX>(input, out, area, antialias, linear, stream);
        } else {
          launch_resize<scalar_t, int64_t, PX>(input, out, area, antialias, linear, stream);
        }
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m) {
  m.impl("resize", &resize_cuda);
}

}  // namespace gpu_ops
