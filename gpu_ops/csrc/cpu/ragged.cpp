// CPU kernels of the ragged-batch ops (images of different sizes packed into one buffer, see
// ragged_view in ../common.h): the same per-pixel functions as the dense kernels, with per-sample
// sizes and strides. Each writes one dense NCHW output batch.
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
#include "separable.h"
#include "warp_columns.h"

namespace gpu_ops {
namespace {

struct Norm {
  std::vector<float> mean, inv;
};

Norm read_norm(const at::Tensor& mean_, const at::Tensor& std_, int64_t C) {
  Norm n{std::vector<float>(C), std::vector<float>(C)};
  const at::Tensor m = mean_.contiguous(), s = std_.contiguous();
  for (int64_t c = 0; c < C; ++c) {
    n.mean[c] = m.const_data_ptr<float>()[c];
    n.inv[c] = 1.f / s.const_data_ptr<float>()[c];
  }
  return n;
}

at::Tensor rcmn_ragged_cpu(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                           bool channels_first, const at::Tensor& boxes_, const at::Tensor& sizes_,
                           const at::Tensor& flip_, const at::Tensor& mean_, const at::Tensor& std_,
                           int64_t out_h, int64_t out_w, at::ScalarType out_dtype, bool antialias,
                           double fill) {
  const char* op = "resized_crop_mirror_normalize_ragged";
  check_ragged(op, data_, index_, C, true);
  check_ragged_per_sample(op, index_, boxes_, "boxes", 4, at::kLong);
  check_ragged_per_sample(op, index_, sizes_, "sizes", 2, at::kLong);
  check_ragged_per_sample(op, index_, flip_, "flip", 0, at::kBool);
  check_ragged_norm(op, data_, mean_, std_, C, out_h, out_w, out_dtype);
  check_ragged_bounds(op, index_, C, data_.numel());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const at::Tensor boxes = boxes_.contiguous(), sizes = sizes_.contiguous();
  const at::Tensor flip = flip_.contiguous();
  const int64_t B = index.size(0);
  at::Tensor out = at::empty({B, C, out_h, out_w}, data.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const Norm n = read_norm(mean_, std_, C);
  const float f = static_cast<float>(fill);
  const int64_t plane = out_h * out_w;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "rcmn_ragged_cpu", [&] {
    const uint8_t* src = data.const_data_ptr<uint8_t>();
    const int64_t* ix = index.const_data_ptr<int64_t>();
    const int64_t* bx = boxes.const_data_ptr<int64_t>();
    const int64_t* sz = sizes.const_data_ptr<int64_t>();
    const bool* fl = flip.const_data_ptr<bool>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    // Per sample, the rows of a chunk go through the separable passes of separable.h (the same
    // sums as resample_at per pixel); the sample's own size (rh, rw) is resampled, the rest of the
    // canvas is fill.
    gpu_ops::parallel_for(0, B * out_h, 1, [&](int64_t begin, int64_t end) {
      BoxResampler resampler;
      for_each_sample_rows(begin, end, out_h, [&](int64_t b, int64_t ya, int64_t yb) {
        const RaggedView v = ragged_view(ix, b, C, channels_first, data.numel());
        const Box box = clip_box(bx + 4 * b, v.H, v.W);
        // (an image outside the buffer is refused by check_ragged_bounds; fill it all regardless)
        const int64_t rh = v.ok ? std::min(sz[2 * b], out_h) : 0;
        const int64_t rw = v.ok ? std::min(sz[2 * b + 1], out_w) : 0;
        scalar_t* db = dst + b * C * plane;
        const scalar_t fv = static_cast<scalar_t>(f);
        for (int64_t c = 0; c < C; ++c) {  // fill first: the canvas outside rh x rw
          for (int64_t y = ya; y < yb; ++y) {
            scalar_t* d = db + c * plane + y * out_w;
            for (int64_t x = y < rh ? rw : 0; x < out_w; ++x) d[x] = fv;
          }
        }
        if (rh <= 0 || rw <= 0 || ya >= rh) return;
        resampler.set(antialias, box.height, box.width, rh, rw, fl[b]);
        const uint8_t* s = src + v.offset + box.top * v.sy + box.left * v.sx;
        resampler.rows(s, v.sy, v.sx, v.sc, C, ya, std::min(yb, rh), [&](int64_t y, int64_t c, int64_t x, float r) {
          db[c * plane + y * out_w + x] = static_cast<scalar_t>((r - n.mean[c]) * n.inv[c]);
        });
      });
    });
  });
  return out;
}

at::Tensor cmn_ragged_cpu(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
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
  check_ragged_bounds(op, index_, C, data_.numel());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const at::Tensor crop = crop_.contiguous(), flip = flip_.contiguous();
  const int64_t B = index.size(0);
  const int64_t Hp = round_up(out_h, pad_multiple), Wp = round_up(out_w, pad_multiple);
  at::Tensor out = at::empty({B, C, Hp, Wp}, data.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const Norm n = read_norm(mean_, std_, C);
  const float f = static_cast<float>(fill);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "cmn_ragged_cpu", [&] {
    const uint8_t* src = data.const_data_ptr<uint8_t>();
    const int64_t* ix = index.const_data_ptr<int64_t>();
    const int64_t* cr = crop.const_data_ptr<int64_t>();
    const bool* fl = flip.const_data_ptr<bool>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    const std::vector<scalar_t> table = normalize_table<scalar_t>(n.mean.data(), n.inv.data(), C);
    const scalar_t fill_v = static_cast<scalar_t>(f);
    gpu_ops::parallel_for(0, B * Hp, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / Hp, y = row % Hp;
        const RaggedView v = ragged_view(ix, b, C, channels_first, data.numel());
        const int64_t sy = cr[2 * b] + y;
        const bool row_in = y < out_h && sy >= 0 && sy < v.H;
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t* s = src + v.offset + c * v.sc + (row_in ? sy : 0) * v.sy;
          crop_normalize_row(dst + ((b * C + c) * Hp + y) * Wp, Wp, s, v.sx, v.W, cr[2 * b + 1], out_w, fl[b],
                             row_in, table.data() + c * 256, fill_v);
        }
      }
    });
  });
  return out;
}

at::Tensor resize_ragged_cpu(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                             bool channels_first, int64_t out_h, int64_t out_w, int64_t mode,
                             bool antialias) {
  const char* op = "resize_ragged";
  check_ragged(op, data_, index_, C, false);
  TORCH_CHECK(mode == 0 || mode == 1, "gpu_ops.resize_ragged: expected mode 0 (bilinear) or 1 (area), got ", mode);
  check_out_size(op, out_h, out_w);
  check_ragged_bounds(op, index_, C, data_.numel());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const int64_t B = index.size(0);
  at::Tensor out = at::empty({B, C, out_h, out_w}, data.options());
  if (out.numel() == 0) return out;
  const bool area = mode == kResizeArea;
  const int64_t plane = out_h * out_w;
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, data.scalar_type(),
                                  "resize_ragged_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* src = data.const_data_ptr<scalar_t>();
    const int64_t* ix = index.const_data_ptr<int64_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    gpu_ops::parallel_for(0, B * out_h, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / out_h, y = row % out_h;
        const RaggedView v = ragged_view(ix, b, C, channels_first, data.numel());
        scalar_t* d = dst + b * C * plane + y * out_w;
        if (C <= kPixelChannels) {  // all channels of a pixel at once (the same sums)
          A r[kPixelChannels];
          for (int64_t x = 0; x < out_w; ++x) {
            resample_pixel<scalar_t, A>(src + v.offset, v.sy, v.sx, v.sc, C, v.H, v.W, out_h, out_w,
                                        y, x, area, antialias, r);
            for (int64_t c = 0; c < C; ++c) d[c * plane + x] = to_out<scalar_t>(r[c]);
          }
          continue;
        }
        for (int64_t c = 0; c < C; ++c) {
          const scalar_t* s = src + v.offset + c * v.sc;
          for (int64_t x = 0; x < out_w; ++x) {
            d[c * plane + x] = to_out<scalar_t>(resample_at<scalar_t, A>(s, v.sy, v.sx, v.H, v.W, out_h,
                                                                         out_w, y, x, area, antialias));
          }
        }
      }
    });
  });
  return out;
}

at::Tensor warp_affine_ragged_cpu(const at::Tensor& data_, const at::Tensor& index_, int64_t C,
                                  bool channels_first, const at::Tensor& matrix_, int64_t out_h,
                                  int64_t out_w, int64_t interpolation, double fill) {
  const char* op = "warp_affine_ragged";
  check_ragged(op, data_, index_, C, false);
  TORCH_CHECK(matrix_.device() == data_.device() && matrix_.dim() == 3 &&
                  matrix_.size(0) == index_.size(0) && matrix_.size(1) == 2 &&
                  matrix_.size(2) == 3 && matrix_.scalar_type() == at::kDouble,
              "gpu_ops.warp_affine_ragged: expected matrix as float64 [", index_.size(0),
              ", 2, 3] on ", data_.device(), ", got ", matrix_.scalar_type(), " ",
              matrix_.sizes(), " on ", matrix_.device());
  TORCH_CHECK(interpolation == 0 || interpolation == 1,
              "gpu_ops.warp_affine_ragged: expected interpolation 0 (nearest) or 1 (bilinear), got ",
              interpolation);
  check_out_size(op, out_h, out_w);
  check_ragged_bounds(op, index_, C, data_.numel());
  const at::Tensor data = data_.contiguous(), index = index_.contiguous();
  const at::Tensor matrix = matrix_.contiguous();
  const int64_t B = index.size(0);
  at::Tensor out = at::empty({B, C, out_h, out_w}, data.options());
  if (out.numel() == 0) return out;
  const bool nearest = interpolation == kNearest;
  const int64_t plane = out_h * out_w;
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, data.scalar_type(),
                                  "warp_affine_ragged_cpu", [&] {
    const scalar_t* src = data.const_data_ptr<scalar_t>();
    const int64_t* ix = index.const_data_ptr<int64_t>();
    const double* M = matrix.const_data_ptr<double>();
    const scalar_t fv = fill_as<scalar_t>(fill);
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    gpu_ops::parallel_for(0, B * out_h, 1, [&](int64_t begin, int64_t end) {
      WarpColumns cols;
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / out_h, y = row % out_h;
        const RaggedView v = ragged_view(ix, b, C, channels_first, data.numel());
        cols.row(M + 6 * b, b, y, out_w, nearest);
        for (int64_t x = 0; x < out_w; ++x) {
          const WarpCoord wc = cols.at(x);
          for (int64_t c = 0; c < C; ++c) {
            dst[(b * C + c) * plane + y * out_w + x] = warp_sample_strided<scalar_t>(
                src + v.offset + c * v.sc, v.H, v.W, v.sy, v.sx, wc, nearest, fv);
          }
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("resized_crop_mirror_normalize_ragged", &rcmn_ragged_cpu);
  m.impl("crop_mirror_normalize_ragged", &cmn_ragged_cpu);
  m.impl("resize_ragged", &resize_ragged_cpu);
  m.impl("warp_affine_ragged", &warp_affine_ragged_cpu);
}

}  // namespace gpu_ops
