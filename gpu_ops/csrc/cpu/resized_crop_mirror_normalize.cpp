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
#include "separable.h"

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
    // Rows of a chunk are resampled per sample with the separable passes of separable.h (the
    // same sums as the per-pixel window, each input row's horizontal pass done once per chunk).
    gpu_ops::parallel_for(0, B * Hp, grain, [&](int64_t begin, int64_t end) {
      BoxResampler resampler;
      for_each_sample_rows(begin, end, Hp, [&](int64_t b, int64_t ya, int64_t yb) {
        const Box box = clip_box(bx + 4 * b, H, W);
        resampler.set(antialias, box.height, box.width, out_h, out_w, fl[b]);
        const uint8_t* s = src + ((b * H + box.top) * W + box.left) * C;
        scalar_t* db = dst + b * C * Hp * Wp;
        resampler.rows(s, W * C, C, 1, C, std::min(ya, out_h), std::min(yb, out_h),
                       [&](int64_t y, int64_t c, int64_t x, float r) {
                         db[(c * Hp + y) * Wp + x] = static_cast<scalar_t>((r - mean[c]) * inv[c]);
                       });
        const scalar_t fv = static_cast<scalar_t>(f);
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t y = ya; y < yb; ++y) {
            scalar_t* d = db + (c * Hp + y) * Wp;
            for (int64_t x = y < out_h ? out_w : 0; x < Wp; ++x) d[x] = fv;  // padding
          }
        }
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("resized_crop_mirror_normalize", &resized_crop_mirror_normalize_cpu);
}

}  // namespace gpu_ops
