// CPU kernel for gpu_ops::adjust_color: per-sample brightness, contrast, saturation and hue in one
// pass after a per-image reduction (contrast blends with the grey mean of the brightness-adjusted
// image). Semantics in ../common.h (color_pixel).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../common.h"
#include "parallel.h"

namespace gpu_ops {
namespace {

at::Tensor adjust_color_cpu(const at::Tensor& input_, const at::Tensor& brightness_,
                            const at::Tensor& contrast_, const at::Tensor& saturation_,
                            const at::Tensor& hue_) {
  check_adjust_color(input_, brightness_, contrast_, saturation_, hue_);
  const at::Tensor input = input_.contiguous();
  const at::Tensor bt = brightness_.contiguous(), ct = contrast_.contiguous();
  const at::Tensor st = saturation_.contiguous(), ht = hue_.contiguous();
  const int64_t B = input.size(0), H = input.size(2), W = input.size(3);
  const int64_t plane = H * W;
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  const float* bf = bt.const_data_ptr<float>();
  const float* cf = ct.const_data_ptr<float>();
  const float* sf = st.const_data_ptr<float>();
  const float* hf = ht.const_data_ptr<float>();
  std::vector<float> mean(B);
  AT_DISPATCH_FLOATING_TYPES_AND3(
      at::kByte, at::kHalf, at::kBFloat16, input.scalar_type(), "adjust_color_cpu", [&] {
        const bool is_u8 = std::is_same<scalar_t, uint8_t>::value;
        const float in_div = is_u8 ? 255.f : 1.f;
        const scalar_t* src = input.const_data_ptr<scalar_t>();
        scalar_t* dst = out.mutable_data_ptr<scalar_t>();
        // Pass 1: grey mean per image of clamp(x * brightness).
        gpu_ops::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) {
            const scalar_t* s = src + b * 3 * plane;
            double acc = 0.0;
            for (int64_t i = 0; i < plane; ++i) {
              const float r = clamp01(to_float(s[i]) / in_div * bf[b]);
              const float g = clamp01(to_float(s[plane + i]) / in_div * bf[b]);
              const float bl = clamp01(to_float(s[2 * plane + i]) / in_div * bf[b]);
              acc += gray(r, g, bl);
            }
            mean[b] = static_cast<float>(acc / static_cast<double>(plane));
          }
        });
        // Pass 2: the adjustments, pixel by pixel.
        const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, W));
        gpu_ops::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            const int64_t b = row / H, y = row % H;
            const scalar_t* s = src + b * 3 * plane + y * W;
            scalar_t* d = dst + b * 3 * plane + y * W;
            for (int64_t x = 0; x < W; ++x) {
              float r = to_float(s[x]) / in_div;
              float g = to_float(s[plane + x]) / in_div;
              float bl = to_float(s[2 * plane + x]) / in_div;
              color_pixel(r, g, bl, bf[b], cf[b], sf[b], hf[b], mean[b]);
              d[x] = to_out<scalar_t, float>(r * in_div);
              d[plane + x] = to_out<scalar_t, float>(g * in_div);
              d[2 * plane + x] = to_out<scalar_t, float>(bl * in_div);
            }
          }
        });
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("adjust_color", &adjust_color_cpu);
}

}  // namespace gpu_ops
