// The gpu_ops operator library: every schema is declared here, once. Kernels live in cpu/<op>.cpp
// (TORCH_LIBRARY_IMPL(gpu_ops, CPU, m)) and cuda/<op>.cu (TORCH_LIBRARY_IMPL(gpu_ops, CUDA, m));
// Python reaches them through torch.ops.gpu_ops.<op> (see gpu_ops/ops.py for the typed wrappers).
#include <Python.h>
#include <torch/library.h>

#include <string>

extern "C" {
// `import gpu_ops._C` only has to load this shared library, which runs the registrations below; the
// module itself is empty, so no pybind11 is needed (pattern of pytorch/extension-cpp).
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

namespace {
std::string build_info() {
#ifdef GPU_OPS_WITH_CUDA
  return "cpu+cuda";
#else
  return "cpu";
#endif
}

// The build's smoke test (gpu_ops/build.py) calls this with 7: a TORCH_CHECK must reach Python as
// RuntimeError. A toolchain whose C++ runtime does not match torch's crashes here instead.
int64_t self_test_check(int64_t value) {
  TORCH_CHECK(value == 0, "gpu_ops self-test: expected 0, got ", value);
  return value;
}
}  // namespace

TORCH_LIBRARY(gpu_ops, m) {
  // interpolation: 0 nearest, 1 bilinear. matrix: [B, 2, 3] float64, output -> input pixel centres.
  m.def(
      "warp_affine(Tensor input, Tensor matrix, int out_h, int out_w, int interpolation, "
      "float fill) -> Tensor");
  // mode: 0 bilinear, 1 area.
  m.def("resize(Tensor input, int out_h, int out_w, int mode, bool antialias) -> Tensor");
  m.def(
      "crop_mirror_normalize(Tensor input, Tensor crop, Tensor flip, Tensor mean, Tensor std, "
      "int out_h, int out_w, ScalarType out_dtype, int pad_multiple, float fill) -> Tensor");
  m.def(
      "resized_crop_mirror_normalize(Tensor input, Tensor boxes, Tensor flip, Tensor mean, "
      "Tensor std, int out_h, int out_w, ScalarType out_dtype, bool antialias, int pad_multiple, "
      "float fill) -> Tensor");
  m.def(
      "adjust_color(Tensor input, Tensor brightness, Tensor contrast, Tensor saturation, "
      "Tensor hue) -> Tensor");
  // Ragged batches (images of different sizes, one launch per batch): `data` is the 1-D packed
  // buffer, index[b] = (offset, height, width) in elements (int64 [B, 3]), all images have
  // `channels` channels stored HWC or, with channels_first, CHW. Outputs are dense NCHW.
  // sizes[b] = (h, w) of the resized region of sample b inside the out_h x out_w canvas.
  m.def(
      "resized_crop_mirror_normalize_ragged(Tensor data, Tensor index, int channels, "
      "bool channels_first, Tensor boxes, Tensor sizes, Tensor flip, Tensor mean, Tensor std, "
      "int out_h, int out_w, ScalarType out_dtype, bool antialias, float fill) -> Tensor");
  m.def(
      "crop_mirror_normalize_ragged(Tensor data, Tensor index, int channels, "
      "bool channels_first, Tensor crop, Tensor flip, Tensor mean, Tensor std, int out_h, "
      "int out_w, ScalarType out_dtype, int pad_multiple, float fill) -> Tensor");
  m.def(
      "resize_ragged(Tensor data, Tensor index, int channels, bool channels_first, int out_h, "
      "int out_w, int mode, bool antialias) -> Tensor");
  m.def(
      "warp_affine_ragged(Tensor data, Tensor index, int channels, bool channels_first, "
      "Tensor matrix, int out_h, int out_w, int interpolation, float fill) -> Tensor");
  // CPU only (cpu/jpeg_decode.cpp): JPEGs (data[offsets[b]:offsets[b+1]], or with offsets [B, 2]
  // data[offsets[b][0]:offsets[b][1]]) decoded into resized
  // crops. boxes: [B, 4] float64 top, left, height, width in stored pixels; dct_scale: 0 auto, else
  // k of k/8; errors[b] gets sample b's NUL-terminated message (empty when it decoded);
  // fast_dct: libjpeg's IFAST integer IDCT instead of the exact ISLOW one (full DCT scale only);
  // threads: decode threads for this call (0: torch.get_num_threads()).
  m.def(
      "decode_jpeg_crops(Tensor data, Tensor offsets, Tensor boxes, Tensor flip, Tensor(a!) out, "
      "Tensor(b!) errors, bool channels_last, int dct_scale, bool antialias, bool clip_to_box, "
      "bool fast_dct=False, int threads=0) -> ()");
  // CPU only (cpu/records.cpp): records data[spans[b][0]:spans[b][1]] checked against their XXH3-128
  // digests ([B, 16] canonical; None: no check) and, with `out`, copied back to back into it
  // first. Returns bool [B], true where a record does not match. threads: 0 torch's count.
  m.def(
      "gather_check_xxh3(Tensor data, Tensor spans, Tensor? digests, Tensor(a!)? out, int threads=0) "
      "-> Tensor");
  // "cpu" or "cpu+cuda": which kernels this build holds (a catch-all kernel, no tensor inputs).
  m.def("_build_info() -> str", &build_info);
  // Raises unless value == 0: the post-build smoke test of gpu_ops/build.py.
  m.def("_self_test_check(int value) -> int", &self_test_check);
}
