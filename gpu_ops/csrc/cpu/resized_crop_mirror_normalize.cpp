// CPU kernel for gpu_ops::resized_crop_mirror_normalize: per-sample crop box (clipped to the image)
// resampled to out_h x out_w with the bilinear window of ../common.h (optionally antialiased), flipped
// per sample, normalised per channel, uint8 NHWC -> float NCHW, padded to a multiple of
// pad_multiple. No intermediate rounding: the resampled value goes straight to the normalisation.
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

at::Tensor resized_crop_mirror_normalize_cpu(const at::Tensor& input_, const at::Tensor& boxes_,
                                             const at::Tensor& flip_, const at::Tensor& mean_,
                                             const at::Tensor& std_, int64_t out_h, int64_t out_w,
                                             at::ScalarType out_dtype, bool antialias,
                                             int64_t pad_multiple, double fill) {
  check_resized_crop_mirror_normalize(input_, boxes_, flip_, mean_, std_, out_h, out_w, out_dtype,
                                      pad_multiple);
  const at::Tensor input = input_.contiguous();
  const at::Tensor boxes = boxes_.contiguous();
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
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, Wp * C));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype,
                                  "resized_crop_mirror_normalize_cpu", [&] {
    const uint8_t* src = input.const_data_ptr<uint8_t>();
    const int64_t* bx = boxes.const_data_ptr<int64_t>();
    const bool* fl = flip.const_data_ptr<bool>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    gpu_ops::parallel_for(0, B * Hp, grain, [&](int64_t begin, int64_t end) {
      std::vector<Axis> ax(out_w);
      std::vector<Lin> lx(out_w);
      int64_t cur_b = -1;
      bool linear = true;
      Box box{};
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / Hp, y = row % Hp;
        if (b != cur_b) {
          cur_b = b;
          box = clip_box(bx + 4 * b, H, W);
          linear = is_linear(false, antialias, box.width, out_w) &&
                   is_linear(false, antialias, box.height, out_h);
          for (int64_t x = 0; x < out_w; ++x) {
            const int64_t xs = fl[b] ? out_w - 1 - x : x;
            ax[x] = make_axis(false, antialias, box.width, out_w, xs);
            lx[x] = linear_axis(box.width, out_w, xs);
          }
        }
        Axis ay{};
        Lin ly{};
        if (y < out_h) {
          ay = make_axis(false, antialias, box.height, out_h, y);
          ly = linear_axis(box.height, out_h, y);
        }
        const uint8_t* s = src + ((b * H + box.top) * W + box.left) * C;
        for (int64_t c = 0; c < C; ++c) {
          scalar_t* d = dst + ((b * C + c) * Hp + y) * Wp;
          for (int64_t x = 0; x < Wp; ++x) {
            float v = f;
            if (y < out_h && x < out_w) {
              const float r = linear ? sample_linear<uint8_t, float>(s + c, W * C, C, ly, lx[x])
                                     : sample_window<uint8_t, float>(s + c, W * C, C, ay, ax[x]);
              v = (r - mean[c]) * inv[c];
            }
            d[x] = static_cast<scalar_t>(v);
          }
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("resized_crop_mirror_normalize", &resized_crop_mirror_normalize_cpu);
}

}  // namespace gpu_ops
