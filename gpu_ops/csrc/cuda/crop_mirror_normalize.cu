// CUDA kernel for gpu_ops::crop_mirror_normalize. Each thread makes 4 consecutive output columns of
// one row for all channels: where the 4 source pixels lie inside the image it reads their 4*C bytes
// with C aligned 32-bit loads (funnel-shifted into place), and it writes each channel's 4 values with
// one vector store when rows are a multiple of 4 wide. Borders, padding and odd widths take the
// per-element path. Same arithmetic as the CPU kernel: (x - mean) * (1 / std).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../checks.h"
#include "../common.h"
#include "launch.cuh"

namespace gpu_ops {
namespace {

template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// Loads the kC words (4 * kC bytes) starting at p, which may be unaligned. Only words that hold at
// least one of those bytes are read, so nothing outside the tensor is touched.
template <int kC>
__device__ __forceinline__ void load_bytes(const uint8_t* p, uint32_t (&w)[kC]) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const uint32_t sh = static_cast<uint32_t>(addr & 3u) * 8u;
  uint32_t raw[kC + 1];
#pragma unroll
  for (int j = 0; j < kC; ++j) raw[j] = __ldg(base + j);
  raw[kC] = sh ? __ldg(base + kC) : 0u;
#pragma unroll
  for (int j = 0; j < kC; ++j) w[j] = __funnelshift_r(raw[j], raw[j + 1], sh);
}

// Streaming (evict-first) stores: the output is written once and read by the next kernel, not by us.
template <typename T>
__device__ __forceinline__ void store_vec4(T* p, const Vec4<T>& v) {
  if constexpr (sizeof(Vec4<T>) == 16) {
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&v));
  } else if constexpr (sizeof(Vec4<T>) == 8) {
    __stcs(reinterpret_cast<int2*>(p), *reinterpret_cast<const int2*>(&v));
  } else {
    *reinterpret_cast<Vec4<T>*>(p) = v;
  }
}

// Grid: x over 4-column groups of a row, y over rows (b * Hp + y), so the only division left is
// row / Hp, uniform across the block.
template <typename out_t, int kC, typename index_t>
__global__ void __launch_bounds__(cuda::kThreads)
    cmn_kernel(const uint8_t* __restrict__ src, const int64_t* __restrict__ crop,
               const bool* __restrict__ flip, const float* __restrict__ mean,
               const float* __restrict__ stdv, out_t* __restrict__ dst, index_t H, index_t W,
               index_t out_h, index_t out_w, index_t Hp, index_t Wp, index_t groups_per_row,
               index_t rows, float fill, bool vec_store) {
  float m[kC], inv[kC];
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    m[c] = mean[c];
    inv[c] = 1.f / stdv[c];
  }
  const index_t g = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups_per_row) return;
  for (index_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const index_t b = row / Hp;
    const index_t y = row - b * Hp;
    const int64_t x0 = static_cast<int64_t>(g) * 4;
    const int64_t top = crop[2 * static_cast<int64_t>(b)];
    const int64_t left = crop[2 * static_cast<int64_t>(b) + 1];
    const bool fl = flip[b];
    const int64_t sy = top + y;
    const bool row_in = y < out_h && sy >= 0 && sy < H;
    // Lowest source column of the group: the 4 source pixels are contiguous either way.
    const int64_t p0 = fl ? left + out_w - 1 - (x0 + 3) : left + x0;
    const bool fast = row_in && x0 + 3 < out_w && p0 >= 0 && p0 + 3 < W;
    float v[kC][4];
    if (fast) {
      uint32_t w[kC];
      load_bytes<kC>(src + ((static_cast<int64_t>(b) * H + sy) * W + p0) * kC, w);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const int byte = k * kC + c;
          const uint32_t u = (w[byte / 4] >> (8 * (byte % 4))) & 0xffu;
          v[c][k] = (static_cast<float>(u) - m[c]) * inv[c];
        }
      }
      if (fl) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const float t0 = v[c][0], t1 = v[c][1];
          v[c][0] = v[c][3];
          v[c][1] = v[c][2];
          v[c][2] = t1;
          v[c][3] = t0;
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t x = x0 + k;
        const int64_t sx = left + (fl ? out_w - 1 - x : x);
        const bool ok = row_in && x < out_w && sx >= 0 && sx < W;
        const uint8_t* s = src + ((static_cast<int64_t>(b) * H + (ok ? sy : 0)) * W + (ok ? sx : 0)) * kC;
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          v[c][k] = ok ? (static_cast<float>(s[c]) - m[c]) * inv[c] : fill;
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      out_t* d = dst + ((static_cast<int64_t>(b) * kC + c) * Hp + y) * Wp + x0;
      if (vec_store) {
        Vec4<out_t> pk;
#pragma unroll
        for (int k = 0; k < 4; ++k) pk.v[k] = static_cast<out_t>(v[c][k]);
        store_vec4(d, pk);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (x0 + k < Wp) d[k] = static_cast<out_t>(v[c][k]);
        }
      }
    }
  }
}

template <typename out_t, int kC, typename index_t>
void launch_cmn(const at::Tensor& input, const at::Tensor& crop, const at::Tensor& flip,
                const at::Tensor& mean, const at::Tensor& stdv, at::Tensor& out, int64_t out_h,
                int64_t out_w, float fill, cudaStream_t stream) {
  const int64_t B = input.size(0), H = input.size(1), W = input.size(2);
  const int64_t Hp = out.size(2), Wp = out.size(3);
  const int64_t groups_per_row = (Wp + 3) / 4;
  const int64_t rows = B * Hp;
  const bool vec_store = Wp % 4 == 0;
  const int threads = static_cast<int>(std::min<int64_t>(cuda::kThreads, (groups_per_row + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned int>((groups_per_row + threads - 1) / threads),
                  static_cast<unsigned int>(std::min<int64_t>(rows, 65535)));
  cmn_kernel<out_t, kC, index_t><<<grid, threads, 0, stream>>>(
      input.const_data_ptr<uint8_t>(), crop.const_data_ptr<int64_t>(),
      flip.const_data_ptr<bool>(), mean.const_data_ptr<float>(), stdv.const_data_ptr<float>(),
      out.mutable_data_ptr<out_t>(), H, W, out_h, out_w, Hp, Wp, groups_per_row, rows, fill,
      vec_store);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename out_t, typename index_t>
void launch_cmn_channels(int64_t C, const at::Tensor& input, const at::Tensor& crop,
                         const at::Tensor& flip, const at::Tensor& mean, const at::Tensor& stdv,
                         at::Tensor& out, int64_t out_h, int64_t out_w, float fill,
                         cudaStream_t stream) {
  switch (C) {
    case 1: launch_cmn<out_t, 1, index_t>(input, crop, flip, mean, stdv, out, out_h, out_w, fill, stream); break;
    case 2: launch_cmn<out_t, 2, index_t>(input, crop, flip, mean, stdv, out, out_h, out_w, fill, stream); break;
    case 3: launch_cmn<out_t, 3, index_t>(input, crop, flip, mean, stdv, out, out_h, out_w, fill, stream); break;
    case 4: launch_cmn<out_t, 4, index_t>(input, crop, flip, mean, stdv, out, out_h, out_w, fill, stream); break;
    default: TORCH_CHECK(false, "gpu_ops.crop_mirror_normalize: expected 1 to 4 channels, got ", C);
  }
}

at::Tensor crop_mirror_normalize_cuda(const at::Tensor& input_, const at::Tensor& crop_,
                                      const at::Tensor& flip_, const at::Tensor& mean_,
                                      const at::Tensor& std_, int64_t out_h, int64_t out_w,
                                      at::ScalarType out_dtype, int64_t pad_multiple,
                                      double fill) {
  check_crop_mirror_normalize(input_, crop_, flip_, mean_, std_, out_h, out_w, out_dtype,
                              pad_multiple);
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous();
  const at::Tensor crop = crop_.contiguous();
  const at::Tensor flip = flip_.contiguous();
  const at::Tensor mean = mean_.contiguous();
  const at::Tensor stdv = std_.contiguous();
  const int64_t B = input.size(0), C = input.size(3);
  const int64_t Hp = round_up(out_h, pad_multiple), Wp = round_up(out_w, pad_multiple);
  at::Tensor out = at::empty({B, C, Hp, Wp}, input.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool small = cuda::fits_int32(input.numel()) && cuda::fits_int32(out.numel());
  const float f = static_cast<float>(fill);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "crop_mirror_normalize_cuda",
                                  [&] {
    if (small) {
      launch_cmn_channels<scalar_t, int32_t>(C, input, crop, flip, mean, stdv, out, out_h, out_w, f, stream);
    } else {
      launch_cmn_channels<scalar_t, int64_t>(C, input, crop, flip, mean, stdv, out, out_h, out_w, f, stream);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m) {
  m.impl("crop_mirror_normalize", &crop_mirror_normalize_cuda);
}

}  // namespace gpu_ops
