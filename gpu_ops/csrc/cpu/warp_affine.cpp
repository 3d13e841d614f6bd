// CPU kernel for gpu_ops::warp_affine (semantics in ../common.h: cv2.warpAffine with
// WARP_INVERSE_MAP, INTER_LINEAR or INTER_NEAREST, BORDER_CONSTANT).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "../checks.h"
#include "../common.h"
#include "parallel.h"
#include "warp_columns.h"

namespace gpu_ops {
namespace {

at::Tensor warp_affine_cpu(const at::Tensor& input_, const at::Tensor& matrix_, int64_t out_h,
                           int64_t out_w, int64_t interpolation, double fill) {
  check_warp_affine(input_, matrix_, out_h, out_w, interpolation);
  const at::Tensor input = input_.contiguous();
  const at::Tensor matrix = matrix_.contiguous();
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  at::Tensor out = at::empty({B, C, out_h, out_w}, input.options());
  if (out.numel() == 0) return out;
  const bool nearest = interpolation == kNearest;
  const int64_t out_plane = out_h * out_w;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, out_w * C));
  AT_DISPATCH_FLOATING_TYPES_AND3(
      at::kByte, at::kHalf, at::kBFloat16, input.scalar_type(), "warp_affine_cpu", [&] {
        const scalar_t* src = input.const_data_ptr<scalar_t>();
        scalar_t* dst = out.mutable_data_ptr<scalar_t>();
        const double* M = matrix.const_data_ptr<double>();
        const scalar_t f = fill_as<scalar_t>(fill);
        gpu_ops::parallel_for(0, B * out_h, grain, [&](int64_t begin, int64_t end) {
          WarpColumns cols;
          for (int64_t row = begin; row < end; ++row) {
            const int64_t b = row / out_h, y = row % out_h;
            cols.row(M + b * 6, b, y, out_w, nearest);
            const scalar_t* s = src + b * C * H * W;
            scalar_t* d = dst + b * C * out_plane + y * out_w;
            for (int64_t x = 0; x < out_w; ++x) {
              warp_affine_pixel<scalar_t>(s, d + x, C, H, W, out_plane, cols.at(x), nearest, f);
            }
          }
        });
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("warp_affine", &warp_affine_cpu);
}

}  // namespace gpu_ops
