// CPU kernel for gpu_ops::crop_mirror_normalize: uint8 NHWC -> float NCHW in one pass, with a
// per-sample crop window (top-left; pixels outside the image take `fill`), per-sample horizontal
// flip of the window, (x - mean) * (1 / std) per channel, and the output padded with `fill` at the
// bottom and right to a multiple of pad_multiple.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../common.h"
#include "normalize.h"
#include "parallel.h"

namespace gpu_ops {
namespace {

at::Tensor crop_mirror_normalize_cpu(const at::Tensor& input_, const at::Tensor& crop_,
                                     const at::Tensor& flip_, const at::Tensor& mean_,
                                     const at::Tensor& std_, int64_t out_h, int64_t out_w,
                                     at::ScalarType out_dtype, int64_t pad_multiple, double fill) {
  check_crop_mirror_normalize(input_, crop_, flip_, mean_, std_, out_h, out_w, out_dtype,
                              pad_multiple);
  const at::Tensor input = input_.contiguous();
  const at::Tensor crop = crop_.contiguous();
  const at::Tensor flip = flip_.contiguous();
  const int64_t B = input.size(0), H = input.size(1), W = input.size(2), C = input.size(3);
  const int64_t Hp = round_up(out_h, pad_multiple), Wp = round_up(out_w, pad_multiple);
  at::Tensor out = at::empty({B, C, Hp, Wp}, input.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  std::vector<float> mean(C), inv(C);
  const at::Tensor mean_c = mean_.contiguous(), std_c = std_.contiguous();
  for (int64_t c = 0; c < C; ++c) {
    mean[c] = mean_c.const_data_ptr<float>()[c];
    inv[c] = 1.f / std_c.const_data_ptr<float>()[c];
  }
  const float f = static_cast<float>(fill);
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, Wp * C));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "crop_mirror_normalize_cpu",
                                  [&] {
    const uint8_t* src = input.const_data_ptr<uint8_t>();
    const int64_t* cr = crop.const_data_ptr<int64_t>();
    const bool* fl = flip.const_data_ptr<bool>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    const std::vector<scalar_t> table = normalize_table<scalar_t>(mean.data(), inv.data(), C);
    const scalar_t fill_v = static_cast<scalar_t>(f);
    gpu_ops::parallel_for(0, B * Hp, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / Hp, y = row % Hp;
        const int64_t sy = cr[2 * b] + y;
        const bool row_in = y < out_h && sy >= 0 && sy < H;
        const uint8_t* s = src + (b * H + (row_in ? sy : 0)) * W * C;
        for (int64_t c = 0; c < C; ++c) {
          crop_normalize_row(dst + ((b * C + c) * Hp + y) * Wp, Wp, s + c, C, W, cr[2 * b + 1], out_w, fl[b],
                             row_in, table.data() + c * 256, fill_v);
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("crop_mirror_normalize", &crop_mirror_normalize_cpu);
}

}  // namespace gpu_ops
