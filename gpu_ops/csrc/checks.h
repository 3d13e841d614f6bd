// Argument checks shared by the CPU and CUDA implementations. Every message names the op, what was
// expected and what was found.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>

namespace gpu_ops {

inline bool is_image_dtype(at::ScalarType t) {
  return t == at::kByte || t == at::kHalf || t == at::kBFloat16 || t == at::kFloat ||
         t == at::kDouble;
}
inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble;
}

inline void check_same_device(const char* op, const at::Tensor& input, const at::Tensor& t,
                              const char* name) {
  TORCH_CHECK(t.device() == input.device(), "gpu_ops.", op, ": expected ", name,
              " on the input's device ", input.device(), ", got ", t.device());
}

inline void check_per_sample(const char* op, const at::Tensor& input, const at::Tensor& t,
                             const char* name) {
  check_same_device(op, input, t, name);
  TORCH_CHECK(t.dim() == 1 && t.size(0) == input.size(0), "gpu_ops.", op, ": expected ", name,
              " of shape [", input.size(0), "] (one value per sample), got ", t.sizes());
}

inline void check_out_size(const char* op, int64_t out_h, int64_t out_w) {
  TORCH_CHECK(out_h >= 0 && out_w >= 0, "gpu_ops.", op,
              ": expected a non-negative output size, got (", out_h, ", ", out_w, ")");
}

inline void check_warp_affine(const at::Tensor& input, const at::Tensor& matrix, int64_t out_h,
                              int64_t out_w, int64_t interpolation) {
  TORCH_CHECK(input.dim() == 4, "gpu_ops.warp_affine: expected input of shape [B, C, H, W], got ",
              input.sizes());
  TORCH_CHECK(is_image_dtype(input.scalar_type()),
              "gpu_ops.warp_affine: expected input dtype uint8, float16, bfloat16, float32 or "
              "float64, got ",
              input.scalar_type());
  check_same_device("warp_affine", input, matrix, "matrix");
  TORCH_CHECK(matrix.dim() == 3 && matrix.size(0) == input.size(0) && matrix.size(1) == 2 &&
                  matrix.size(2) == 3,
              "gpu_ops.warp_affine: expected matrix of shape [", input.size(0), ", 2, 3], got ",
              matrix.sizes());
  TORCH_CHECK(matrix.scalar_type() == at::kDouble,
              "gpu_ops.warp_affine: expected matrix dtype float64, got ", matrix.scalar_type());
  TORCH_CHECK(interpolation == 0 || interpolation == 1,
              "gpu_ops.warp_affine: expected interpolation 0 (nearest) or 1 (bilinear), got ",
              interpolation);
  check_out_size("warp_affine", out_h, out_w);
}

inline void check_resize(const at::Tensor& input, int64_t out_h, int64_t out_w, int64_t mode) {
  TORCH_CHECK(input.dim() == 4, "gpu_ops.resize: expected input of shape [B, C, H, W], got ",
              input.sizes());
  TORCH_CHECK(is_image_dtype(input.scalar_type()),
              "gpu_ops.resize: expected input dtype uint8, float16, bfloat16, float32 or float64, "
              "got ",
              input.scalar_type());
  TORCH_CHECK(mode == 0 || mode == 1,
              "gpu_ops.resize: expected mode 0 (bilinear) or 1 (area), got ", mode);
  check_out_size("resize", out_h, out_w);
  TORCH_CHECK(input.numel() > 0 || input.size(0) == 0 || out_h * out_w == 0,
              "gpu_ops.resize: expected a non-empty image, got input of shape ", input.sizes());
}

// Shared by crop_mirror_normalize and resized_crop_mirror_normalize: uint8 NHWC input, [B] bool
// flips, [C] float32 mean and std.
inline void check_cmn_common(const char* op, const at::Tensor& input, const at::Tensor& flip,
                             const at::Tensor& mean, const at::Tensor& std, int64_t out_h,
                             int64_t out_w, at::ScalarType out_dtype, int64_t pad_multiple) {
  TORCH_CHECK(input.dim() == 4, "gpu_ops.", op,
              ": expected uint8 input of shape [B, H, W, C] (NHWC, as decoders produce), got ",
              input.sizes());
  TORCH_CHECK(input.scalar_type() == at::kByte, "gpu_ops.", op,
              ": expected input dtype uint8, got ", input.scalar_type());
  const int64_t C = input.size(3);
  TORCH_CHECK(C >= 1 && C <= 4, "gpu_ops.", op, ": expected 1 to 4 channels (last dim), got ", C);
  check_per_sample(op, input, flip, "flip");
  TORCH_CHECK(flip.scalar_type() == at::kBool, "gpu_ops.", op,
              ": expected flip dtype bool, got ", flip.scalar_type());
  check_same_device(op, input, mean, "mean");
  check_same_device(op, input, std, "std");
  TORCH_CHECK(mean.dim() == 1 && mean.size(0) == C && mean.scalar_type() == at::kFloat,
              "gpu_ops.", op, ": expected mean as float32 of shape [", C, "], got ",
              mean.scalar_type(), " of shape ", mean.sizes());
  TORCH_CHECK(std.dim() == 1 && std.size(0) == C && std.scalar_type() == at::kFloat, "gpu_ops.",
              op, ": expected std as float32 of shape [", C, "], got ", std.scalar_type(),
              " of shape ", std.sizes());
  check_out_size(op, out_h, out_w);
  TORCH_CHECK(is_float_dtype(out_dtype), "gpu_ops.", op,
              ": expected out_dtype float16, bfloat16, float32 or float64, got ", out_dtype);
  TORCH_CHECK(pad_multiple >= 1, "gpu_ops.", op, ": expected pad_multiple >= 1, got ",
              pad_multiple);
}

inline int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

inline void check_crop_mirror_normalize(const at::Tensor& input, const at::Tensor& crop,
                                        const at::Tensor& flip, const at::Tensor& mean,
                                        const at::Tensor& std, int64_t out_h, int64_t out_w,
                                        at::ScalarType out_dtype, int64_t pad_multiple) {
  check_cmn_common("crop_mirror_normalize", input, flip, mean, std, out_h, out_w, out_dtype,
                   pad_multiple);
  check_same_device("crop_mirror_normalize", input, crop, "crop");
  TORCH_CHECK(crop.dim() == 2 && crop.size(0) == input.size(0) && crop.size(1) == 2 &&
                  crop.scalar_type() == at::kLong,
              "gpu_ops.crop_mirror_normalize: expected crop as int64 of shape [", input.size(0),
              ", 2] (top, left), got ", crop.scalar_type(), " of shape ", crop.sizes());
}

inline void check_resized_crop_mirror_normalize(const at::Tensor& input, const at::Tensor& boxes,
                                                const at::Tensor& flip, const at::Tensor& mean,
                                                const at::Tensor& std, int64_t out_h,
                                                int64_t out_w, at::ScalarType out_dtype,
                                                int64_t pad_multiple) {
  check_cmn_common("resized_crop_mirror_normalize", input, flip, mean, std, out_h, out_w,
                   out_dtype, pad_multiple);
  check_same_device("resized_crop_mirror_normalize", input, boxes, "boxes");
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(0) == input.size(0) && boxes.size(1) == 4 &&
                  boxes.scalar_type() == at::kLong,
              "gpu_ops.resized_crop_mirror_normalize: expected boxes as int64 of shape [",
              input.size(0), ", 4] (top, left, height, width), got ", boxes.scalar_type(),
              " of shape ", boxes.sizes());
  TORCH_CHECK(input.size(0) == 0 || (input.size(1) >= 1 && input.size(2) >= 1),
              "gpu_ops.resized_crop_mirror_normalize: expected images of at least 1x1, got input "
              "of shape ",
              input.sizes());
}

inline void check_adjust_color(const at::Tensor& input, const at::Tensor& brightness,
                               const at::Tensor& contrast, const at::Tensor& saturation,
                               const at::Tensor& hue) {
  TORCH_CHECK(input.dim() == 4 && input.size(1) == 3,
              "gpu_ops.adjust_color: expected RGB input of shape [B, 3, H, W], got ",
              input.sizes());
  TORCH_CHECK(is_image_dtype(input.scalar_type()),
              "gpu_ops.adjust_color: expected input dtype uint8, float16, bfloat16, float32 or "
              "float64, got ",
              input.scalar_type());
  const at::Tensor* factors[4] = {&brightness, &contrast, &saturation, &hue};
  const char* names[4] = {"brightness", "contrast", "saturation", "hue"};
  for (int i = 0; i < 4; ++i) {
    check_per_sample("adjust_color", input, *factors[i], names[i]);
    TORCH_CHECK(factors[i]->scalar_type() == at::kFloat, "gpu_ops.adjust_color: expected ",
                names[i], " dtype float32, got ", factors[i]->scalar_type());
  }
}

// Ragged batches: data 1-D, index int64 [B, 3] (offset, height, width) on data's device.
inline void check_ragged(const char* op, const at::Tensor& data, const at::Tensor& index,
                         int64_t channels, bool uint8_only) {
  TORCH_CHECK(data.dim() == 1, "gpu_ops.", op,
              ": expected data as a 1-D packed buffer, got shape ", data.sizes());
  if (uint8_only) {
    TORCH_CHECK(data.scalar_type() == at::kByte, "gpu_ops.", op,
                ": expected data dtype uint8, got ", data.scalar_type());
    TORCH_CHECK(channels >= 1 && channels <= 4, "gpu_ops.", op,
                ": expected 1 to 4 channels, got ", channels);
  } else {
    TORCH_CHECK(is_image_dtype(data.scalar_type()), "gpu_ops.", op,
                ": expected data dtype uint8, float16, bfloat16, float32 or float64, got ",
                data.scalar_type());
    TORCH_CHECK(channels >= 1, "gpu_ops.", op, ": expected channels >= 1, got ", channels);
  }
  TORCH_CHECK(index.device() == data.device(), "gpu_ops.", op,
              ": expected index on the data's device ", data.device(), ", got ", index.device());
  TORCH_CHECK(index.dim() == 2 && index.size(1) == 3 && index.scalar_type() == at::kLong,
              "gpu_ops.", op,
              ": expected index as int64 of shape [B, 3] (offset, height, width), got ",
              index.scalar_type(), " of shape ", index.sizes());
}

// Host-side bounds check of every sample (CPU kernels; the CUDA kernels fill a sample whose
// entry is out of bounds instead of reading it, and the Python wrapper checks before either).
inline void check_ragged_bounds(const char* op, const at::Tensor& index, int64_t channels,
                                int64_t numel) {
  const at::Tensor idx = index.contiguous();
  const int64_t* p = idx.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < idx.size(0); ++b) {
    const int64_t off = p[3 * b], h = p[3 * b + 1], w = p[3 * b + 2];
    TORCH_CHECK(off >= 0 && h >= 1 && w >= 1 && off + h * w * channels <= numel, "gpu_ops.", op,
                ": sample ", b, " (offset ", off, ", ", h, "x", w, "x", channels,
                ") does not lie inside the packed buffer of ", numel, " elements");
  }
}

inline void check_ragged_per_sample(const char* op, const at::Tensor& index, const at::Tensor& t,
                                    const char* name, int64_t cols, at::ScalarType dtype) {
  TORCH_CHECK(t.device() == index.device(), "gpu_ops.", op, ": expected ", name,
              " on the data's device ", index.device(), ", got ", t.device());
  const bool shape_ok = cols == 0 ? (t.dim() == 1 && t.size(0) == index.size(0))
                                  : (t.dim() == 2 && t.size(0) == index.size(0) && t.size(1) == cols);
  TORCH_CHECK(shape_ok && t.scalar_type() == dtype, "gpu_ops.", op, ": expected ", name, " as ",
              dtype, " of shape [", index.size(0), cols == 0 ? "" : ", ",
              cols == 0 ? std::string() : std::to_string(cols), "], got ", t.scalar_type(),
              " of shape ", t.sizes());
}

inline void check_ragged_norm(const char* op, const at::Tensor& data, const at::Tensor& mean,
                              const at::Tensor& std, int64_t channels, int64_t out_h,
                              int64_t out_w, at::ScalarType out_dtype) {
  check_same_device(op, data, mean, "mean");
  check_same_device(op, data, std, "std");
  TORCH_CHECK(mean.dim() == 1 && mean.size(0) == channels && mean.scalar_type() == at::kFloat,
              "gpu_ops.", op, ": expected mean as float32 of shape [", channels, "], got ",
              mean.scalar_type(), " of shape ", mean.sizes());
  TORCH_CHECK(std.dim() == 1 && std.size(0) == channels && std.scalar_type() == at::kFloat,
              "gpu_ops.", op, ": expected std as float32 of shape [", channels, "], got ",
              std.scalar_type(), " of shape ", std.sizes());
  check_out_size(op, out_h, out_w);
  TORCH_CHECK(is_float_dtype(out_dtype), "gpu_ops.", op,
              ": expected out_dtype float16, bfloat16, float32 or float64, got ", out_dtype);
}

}  // namespace gpu_ops
