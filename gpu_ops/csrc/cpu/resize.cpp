// CPU kernel for gpu_ops::resize (semantics in ../common.h: F.interpolate bilinear with
// align_corners=False and optional antialias, or area == adaptive average pooling).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../common.h"
#include "parallel.h"

namespace gpu_ops {
namespace {

at::Tensor resize_cpu(const at::Tensor& input_, int64_t out_h, int64_t out_w, int64_t mode,
                      bool antialias) {
  check_resize(input_, out_h, out_w, mode);
  const at::Tensor input = input_.contiguous();
  const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  at::Tensor out = at::empty({B, C, out_h, out_w}, input.options());
  if (out.numel() == 0) return out;
  const bool area = mode == kResizeArea;
  // The windows depend only on the output index, so they are computed once per call.
  const bool linear = is_linear(area, antialias, W, out_w) && is_linear(area, antialias, H, out_h);
  std::vector<Axis> ax(out_w), ay(out_h);
  std::vector<Lin> lx(out_w), ly(out_h);
  for (int64_t x = 0; x < out_w; ++x) {
    ax[x] = make_axis(area, antialias, W, out_w, x);
    lx[x] = linear_axis(W, out_w, x);
  }
  for (int64_t y = 0; y < out_h; ++y) {
    ay[y] = make_axis(area, antialias, H, out_h, y);
    ly[y] = linear_axis(H, out_h, y);
  }
  const int64_t out_plane = out_h * out_w;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, out_w * C));
  AT_DISPATCH_FLOATING_TYPES_AND3(
      at::kByte, at::kHalf, at::kBFloat16, input.scalar_type(), "resize_cpu", [&] {
        using A = acc_t<scalar_t>;
        const scalar_t* src = input.const_data_ptr<scalar_t>();
        scalar_t* dst = out.mutable_data_ptr<scalar_t>();
        gpu_ops::parallel_for(0, B * out_h, grain, [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t b = row / out_h, y = row % out_h;
            for (int64_t c = 0; c < C; ++c) {
              const scalar_t* s = src + (b * C + c) * H * W;
              scalar_t* d = dst + (b * C + c) * out_plane + y * out_w;
              for (int64_t x = 0; x < out_w; ++x) {
                d[x] = to_out<scalar_t>(linear ? sample_linear<scalar_t, A>(s, W, 1, ly[y], lx[x])
                                               : sample_window<scalar_t, A>(s, W, 1, ay[y], ax[x]));
              }
            }
          }
        });
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("resize", &resize_cpu);
}

}  // namespace gpu_ops
