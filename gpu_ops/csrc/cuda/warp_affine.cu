// CUDA kernels for gpu_ops::warp_affine. OpenCV's coordinate arithmetic (../common.h) splits into
// a per-column and a per-row term; a small kernel tabulates both per sample (the double-precision
// work), then the main kernel makes output pixels from integer additions (PX per thread, below).
// Results are bit-identical to the CPU kernel on uint8.
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

// tables[b] = [col_x(out_w) | col_y(out_w) | row_x(out_h) | row_y(out_h)], int64.
__global__ void __launch_bounds__(cuda::kThreads)
    warp_tables_kernel(const double* __restrict__ matrix, int64_t* __restrict__ tables, int64_t B,
                       int64_t out_h, int64_t out_w, bool nearest) {
  const int64_t per = out_w + out_h;
  const int64_t total = B * per;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = i / per, j = i - b * per;
    const double* M = matrix + 6 * b;
    int64_t* t = tables + 2 * per * b;
    if (j < out_w) {
      t[j] = warp_col_term(M[0], j);
      t[out_w + j] = warp_col_term(M[3], j);
    } else {
      const int64_t y = j - out_w;
      t[2 * out_w + y] = warp_row_term(M[1], M[2], y, nearest);
      t[2 * out_w + out_h + y] = warp_row_term(M[4], M[5], y, nearest);
    }
  }
}

// Grid: x over groups of PX output columns, y over output rows b * out_h + y (grid-stride).
// PX = 4 for nearest (little work per pixel: amortise the table loads, vector stores); PX = 1 for
// bilinear, where 4 pixels' taps per thread cost occupancy (H100, 64x3x512x512 uint8 bilinear:
// 0.246 ms with PX = 4, 0.208 ms with PX = 1).
template <typename T, typename index_t, int PX>
__global__ void __launch_bounds__(cuda::kThreads)
    warp_affine_kernel(const T* __restrict__ src, T* __restrict__ dst,
                       const int64_t* __restrict__ tables, index_t C, index_t H, index_t W,
                       index_t out_h, index_t out_w, index_t groups_per_row, index_t rows,
                       bool nearest, T fill, bool vec_store) {
  const index_t g = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups_per_row) return;
  const int64_t plane = static_cast<int64_t>(H) * W;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  for (index_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const index_t b = row / out_h;
    const index_t y = row - b * out_h;
    const int64_t* t = tables + 2 * static_cast<int64_t>(out_w + out_h) * b;
    const int64_t row_x = t[2 * out_w + y];
    const int64_t row_y = t[2 * out_w + out_h + y];
    const int64_t x0 = static_cast<int64_t>(g) * PX;
    WarpCoord c[PX];
#pragma unroll
    for (int k = 0; k < PX; ++k) {
      const int64_t x = x0 + k < out_w ? x0 + k : out_w - 1;  // columns past the row: not stored
      c[k] = warp_finish(row_x + t[x], row_y + t[out_w + x], nearest);
    }
    const T* s = src + static_cast<int64_t>(b) * C * plane;
    T* d = dst + static_cast<int64_t>(b) * C * out_plane + static_cast<int64_t>(y) * out_w + x0;
    for (index_t ch = 0; ch < C; ++ch) {
      VecN<T, PX> v;
#pragma unroll
      for (int k = 0; k < PX; ++k) v.v[k] = warp_sample<T>(s + ch * plane, H, W, c[k], nearest, fill);
      T* dc = d + ch * out_plane;
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
void launch_warp(const at::Tensor& input, const at::Tensor& tables, at::Tensor& out, bool nearest,
                 T fill, cudaStream_t stream) {
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t out_h = out.size(2), out_w = out.size(3);
  const int64_t groups_per_row = (out_w + PX - 1) / PX;
  const int64_t rows = B * out_h;
  const int threads =
      static_cast<int>(std::min<int64_t>(cuda::kThreads, (groups_per_row + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned int>((groups_per_row + threads - 1) / threads),
                  static_cast<unsigned int>(std::min<int64_t>(rows, 65535)));
  warp_affine_kernel<T, index_t, PX><<<grid, threads, 0, stream>>>(
      input.const_data_ptr<T>(), out.mutable_data_ptr<T>(), tables.const_data_ptr<int64_t>(), C,
      H, W, out_h, out_w, groups_per_row, rows, nearest, fill, out_w % PX == 0);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor warp_affine_cuda(const at::Tensor& input_, const at::Tensor& matrix_, int64_t out_h,
                            int64_t out_w, int64_t interpolation, double fill) {
  check_warp_affine(input_, matrix_, out_h, out_w, interpolation);
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous();
  const at::Tensor matrix = matrix_.contiguous();
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  at::Tensor out = at::empty({B, C, out_h, out_w}, input.options());
  if (out.numel() == 0) return out;
  const bool nearest = interpolation == kNearest;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor tables = at::empty({B, 2 * (out_w + out_h)}, input.options().dtype(at::kLong));
  warp_tables_kernel<<<cuda::num_blocks(B * (out_w + out_h)), cuda::kThreads, 0, stream>>>(
      matrix.const_data_ptr<double>(), tables.mutable_data_ptr<int64_t>(), B, out_h, out_w,
      nearest);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const bool small = cuda::fits_int32(input.numel()) && cuda::fits_int32(out.numel());
  AT_DISPATCH_FLOATING_TYPES_AND3(
      at::kByte, at::kHalf, at::kBFloat16, input.scalar_type(), "warp_affine_cuda", [&] {
        const scalar_t f = fill_as<scalar_t>(fill);
        if (small && nearest) {
          launch_warp<scalar_t, int32_t, 4>(input, tables, out, nearest, f, stream);
        } else if (small) {
          launch_warp<scalar_t, int32_t, 1>(input, tables, out, nearest, f, stream);
        } else if (nearest) {
          launch_warp<scalar_t, int64_t, 4>(input, tables, out, nearest, f, stream);
        } else {
          launch_warp<scalar_t, int64_t, 1>(input, tables, out, nearest, f, stream);
        }
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m) {
  m.impl("warp_affine", &warp_affine_cuda);
}

}  // namespace gpu_ops
