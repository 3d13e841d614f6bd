// CPU kernel for gpu_ops::decode_jpeg_crops: a whole batch of JPEGs decoded straight into resized
// crops, on torch.get_num_threads() threads or the `threads` asked for (see the end of the file),
// with the GIL released by the dispatcher.
//
// Per sample (box = [top, left, height, width] in stored-image pixels, float64):
//   1. read the header; pick the smallest libjpeg-turbo DCT scale k/8 (k = 1, 2, 4, 8) at which
//      the box still covers the output size (or the forced `dct_scale`);
//   2. decode only the rows (jpeg_skip_scanlines) and columns (jpeg_crop_scanline) the resampling
//      window touches, into a per-sample buffer;
//   3. resample that region to out_h x out_w with the separable triangle filter of PyTorch's
//      F.interpolate(mode="bilinear", align_corners=False, antialias=...) (the window widened by
//      the downscale factor when antialias), mirrored when flip[b], written into `out` (NHWC or
//      NCHW uint8, any strides, e.g. a pinned buffer).
//
// Taps are clipped to the box (clip_to_box: crop-then-resize, torchvision's resized_crop) or to
// the image (resize-then-crop, the validation transform). Errors never throw from the worker
// threads: each sample's libjpeg message (warnings count: corrupt data is an error, like
// TJFLAG_STOPONWARNING) is written NUL-terminated into errors[b] and the Python wrapper raises
// naming the record. The libjpeg calls live in one C-style function (decode_region) holding no
// C++ object with a destructor, because libjpeg reports errors by longjmp.
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include <jpeglib.h>

#include "parallel.h"

namespace gpu_ops {
namespace {

// ------------------------------------------------------------------------------------------
// libjpeg part (C style: setjmp/longjmp error handling)
// ------------------------------------------------------------------------------------------
struct JpegError {
  jpeg_error_mgr pub;  // must be first: libjpeg hands us a jpeg_error_mgr*
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void on_error_exit(j_common_ptr cinfo) {
  JpegError* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, 1);
}

// Level -1 is a warning about corrupt data ("Premature end of JPEG file", "Corrupt JPEG data: N
// extraneous bytes"): libjpeg would pad and go on; we stop, as the build's strict decode does.
extern "C" void on_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) {
    JpegError* e = reinterpret_cast<JpegError*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, e->message);
    longjmp(e->jump, 1);
  }
}

// One sample's decode request and result. Plain data only (see the file comment).
struct Region {
  // in
  const uint8_t* data;
  size_t size;
  double top, left, height, width;  // box in stored-image pixels
  int64_t out_h, out_w;
  int channels;       // 1 or 3
  int forced_scale;   // 0 = auto, else k of k/8
  bool antialias;
  bool clip_to_box;
  bool fast_dct;              // JDCT_IFAST (TurboJPEG's TJFLAG_FASTDCT) instead of JDCT_ISLOW
  uint8_t* direct;            // non-null: rows of this sample's HWC output (see full_size)
  int64_t direct_stride;      // bytes between those rows
  // out
  int scale;                  // k of k/8 used
  bool full_size;             // a whole-image, same-size decode at scale 1: no resample needed
  int64_t img_w, img_h;       // stored image size (header)
  int64_t buf_x0, buf_y0;     // scaled-image coordinates of buf[0][0]
  int64_t buf_w, buf_h;       // decoded region size
  int64_t clip_x0, clip_x1;   // taps allowed in [clip_x0, clip_x1) (scaled pixels)
  int64_t clip_y0, clip_y1;
  uint8_t* buf;               // malloc'ed; the caller frees it
  char message[JMSG_LENGTH_MAX];
};

// Taps of output pixels along one axis may reach `support` scaled pixels beyond the box.
static double axis_support(double len_scaled, int64_t out, bool antialias) {
  const double s = len_scaled / static_cast<double>(out);
  return (antialias && s > 1.0) ? s : 1.0;
}

// The decoded rows/columns: the taps' range plus a 2-pixel margin inside the image, so that
// libjpeg's fancy (smoothed) chroma upsampling, which replicates edges at the border of a cropped
// or skipped region, never changes a pixel a tap reads.
static void needed_range(double start, double len, int64_t out, bool antialias, int64_t clip0,
                         int64_t clip1, int64_t full, int64_t* lo, int64_t* hi) {
  const double sup = axis_support(len, out, antialias);
  int64_t a = static_cast<int64_t>(std::floor(start - sup - 1.0));
  int64_t b = static_cast<int64_t>(std::ceil(start + len + sup + 1.0));
  a = std::max(a, clip0);
  b = std::min(b, clip1);
  if (b <= a) b = a + 1;
  *lo = std::max<int64_t>(a - 2, 0);
  *hi = std::min<int64_t>(b + 2, full);
}

// The DCT scale (k of k/8): the forced one, else the smallest at which the box still covers the
// output. Sets r->scale and r->full_size (box = the whole image, output = its size, scale 1).
static void choose_scale(Region* r) {
  int k = r->forced_scale;
  if (k == 0) {
    k = 8;
    for (int c = 1; c <= 8; c *= 2) {
      if (r->width * c / 8.0 >= static_cast<double>(r->out_w) &&
          r->height * c / 8.0 >= static_cast<double>(r->out_h)) {
        k = c;
        break;
      }
    }
  }
  r->scale = k;
  // Box = the whole image and output = its own size at DCT scale 1: the triangle filter is the
  // identity, so skip it. With an HWC output whose pixels are packed (r->direct), libjpeg writes
  // the rows straight into the batch tensor; otherwise the decoded image is copied (copy_full).
  r->full_size = k == 8 && std::fabs(r->top) < 1e-9 && std::fabs(r->left) < 1e-9 &&
                 std::fabs(r->height - static_cast<double>(r->img_h)) < 1e-9 &&
                 std::fabs(r->width - static_cast<double>(r->img_w)) < 1e-9 &&
                 r->out_h == r->img_h && r->out_w == r->img_w;
}

// The whole image's rows straight into the output (r->full_size with r->direct). Called inside
// decode_region's setjmp (a libjpeg error jumps back there): no object with a destructor here.
static int read_direct(jpeg_decompress_struct* cinfo, Region* r) {
  JSAMPROW drows[16];
  while (cinfo->output_scanline < cinfo->output_height) {
    const JDIMENSION first = cinfo->output_scanline;
    const JDIMENSION want = std::min<JDIMENSION>(16, cinfo->output_height - first);
    for (JDIMENSION i = 0; i < want; ++i) drows[i] = r->direct + r->direct_stride * (first + i);
    if (jpeg_read_scanlines(cinfo, drows, want) == 0) {
      std::snprintf(r->message, sizeof(r->message), "libjpeg returned no row at %u", first);
      jpeg_destroy_decompress(cinfo);
      return 1;
    }
  }
  jpeg_finish_decompress(cinfo);
  jpeg_destroy_decompress(cinfo);
  return 0;
}

// The rows and columns the resampling reads (r->clip_*, r->buf_*), decoded into r->buf. Called
// inside decode_region's setjmp, like read_direct.
static int read_region(jpeg_decompress_struct* cinfo, Region* r) {
  const int64_t ow = cinfo->output_width, oh = cinfo->output_height;
  const double f = r->scale / 8.0;
  const double x = r->left * f, w = r->width * f, y = r->top * f, h = r->height * f;
  if (r->clip_to_box) {
    r->clip_x0 = static_cast<int64_t>(std::floor(x + 1e-9));
    r->clip_x1 = std::min<int64_t>(ow, static_cast<int64_t>(std::ceil(x + w - 1e-9)));
    r->clip_y0 = static_cast<int64_t>(std::floor(y + 1e-9));
    r->clip_y1 = std::min<int64_t>(oh, static_cast<int64_t>(std::ceil(y + h - 1e-9)));
  } else {
    r->clip_x0 = 0;
    r->clip_x1 = ow;
    r->clip_y0 = 0;
    r->clip_y1 = oh;
  }
  int64_t x0, x1, y0, y1;
  needed_range(x, w, r->out_w, r->antialias, r->clip_x0, r->clip_x1, ow, &x0, &x1);
  needed_range(y, h, r->out_h, r->antialias, r->clip_y0, r->clip_y1, oh, &y0, &y1);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
  if (cw < cinfo->output_width) {
    jpeg_crop_scanline(cinfo, &xoff, &cw);  // widens to iMCU boundaries
  } else {
    xoff = 0;
  }
  r->buf_x0 = xoff;
  r->buf_w = cinfo->output_width;  // after cropping: the decoded width
  r->buf_y0 = y0;
  r->buf_h = y1 - y0;
  const size_t row_bytes = static_cast<size_t>(r->buf_w) * static_cast<size_t>(cinfo->output_components);
  r->buf = static_cast<uint8_t*>(std::malloc(row_bytes * static_cast<size_t>(r->buf_h)));
  if (r->buf == nullptr) {
    std::snprintf(r->message, sizeof(r->message), "out of memory for a %lldx%lld region",
                  static_cast<long long>(r->buf_w), static_cast<long long>(r->buf_h));
    jpeg_destroy_decompress(cinfo);
    return 1;
  }
  if (y0 > 0) {
    const JDIMENSION skipped = jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
    if (skipped != static_cast<JDIMENSION>(y0)) {
      std::snprintf(r->message, sizeof(r->message), "libjpeg skipped %u of %lld rows",
                    skipped, static_cast<long long>(y0));
      jpeg_destroy_decompress(cinfo);
      return 1;
    }
  }
  // Several rows per call, as TurboJPEG does: libjpeg-turbo upsamples and converts whole row
  // groups at once instead of going through its one-row spare buffer.
  JSAMPROW rows[16];
  while (cinfo->output_scanline < static_cast<JDIMENSION>(y1)) {
    const JDIMENSION first = cinfo->output_scanline;
    const JDIMENSION want = std::min<JDIMENSION>(16, static_cast<JDIMENSION>(y1) - first);
    for (JDIMENSION i = 0; i < want; ++i) {
      rows[i] = r->buf + row_bytes * (first + i - static_cast<JDIMENSION>(y0));
    }
    if (jpeg_read_scanlines(cinfo, rows, want) == 0) {
      std::snprintf(r->message, sizeof(r->message), "libjpeg returned no row at %u", first);
      jpeg_destroy_decompress(cinfo);
      return 1;
    }
  }
  if (cinfo->output_scanline == cinfo->output_height) {
    jpeg_finish_decompress(cinfo);  // the whole image was read: check its end too
  }
  // Rows below the region are never decoded; the record checksum covers their bytes.
  jpeg_destroy_decompress(cinfo);
  return 0;
}

// Returns 0 on success; else 1 with r->message set. Frees nothing but libjpeg's state.
static int decode_region(Region* r) {
  jpeg_decompress_struct cinfo;
  JpegError jerr;
  std::memset(&cinfo, 0, sizeof(cinfo));
  cinfo.err = jpeg_std_error(&jerr.pub);
  jerr.pub.error_exit = on_error_exit;
  jerr.pub.emit_message = on_emit_message;
  jerr.message[0] = '\0';
  if (setjmp(jerr.jump)) {
    std::snprintf(r->message, sizeof(r->message), "libjpeg: %s", jerr.message);
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, r->data, static_cast<unsigned long>(r->size));
  jpeg_read_header(&cinfo, TRUE);
  r->img_w = cinfo.image_width;
  r->img_h = cinfo.image_height;
  if (!(r->height > 0 && r->width > 0 && r->top >= -1e-6 && r->left >= -1e-6 &&
        r->top + r->height <= r->img_h + 1e-6 && r->left + r->width <= r->img_w + 1e-6)) {
    std::snprintf(r->message, sizeof(r->message),
                  "crop box [top %.3f, left %.3f, height %.3f, width %.3f] is not inside the "
                  "%lldx%lld image",
                  r->top, r->left, r->height, r->width, static_cast<long long>(r->img_w),
                  static_cast<long long>(r->img_h));
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  choose_scale(r);
  cinfo.scale_num = static_cast<unsigned int>(r->scale);
  cinfo.scale_denom = 8;
  cinfo.out_color_space = r->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  // ISLOW is TurboJPEG's default: the same pixels as the full decode path. IFAST (opt-in) is what
  // FFCV decodes with (TJFLAG_FASTDCT): fewer multiplies, pixels ~1 level off (8 at most on q90
  // photos). libjpeg uses it only for the 8x8 IDCT; the reduced scales (k < 8) have one IDCT each.
  cinfo.dct_method = r->fast_dct ? JDCT_IFAST : JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  if (r->full_size && r->direct != nullptr) return read_direct(&cinfo, r);
  return read_region(&cinfo, r);
}

// ------------------------------------------------------------------------------------------
// Resampling (C++; runs after libjpeg is done)
// ------------------------------------------------------------------------------------------
struct Taps {
  std::vector<int64_t> start;  // buffer index of the first tap, per output pixel
  std::vector<int64_t> count;
  std::vector<float> w;        // `width` weights per output pixel
  int64_t width = 0;
};

inline float tri(float v) {
  v = v < 0.f ? -v : v;
  return v < 1.f ? 1.f - v : 0.f;
}

// Output pixel i samples around centre c = start + (i + 0.5) * len / out (pixel j spans
// [j, j + 1)), as ATen's upsample kernels: the triangle filter of half-width `support`, weights
// normalised over the taps inside [clip0, clip1). `origin` converts to buffer indices.
Taps make_taps(double start, double len, int64_t out, bool antialias, int64_t clip0, int64_t clip1,
               int64_t origin) {
  Taps t;
  const double scale = len / static_cast<double>(out);
  const bool aa = antialias && scale > 1.0;
  const double support = aa ? scale : 1.0;
  const float inv = aa ? static_cast<float>(1.0 / scale) : 1.f;
  t.width = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.start.resize(out);
  t.count.resize(out);
  t.w.assign(static_cast<size_t>(out * t.width), 0.f);
  for (int64_t i = 0; i < out; ++i) {
    const double c = start - static_cast<double>(clip0) + scale * (static_cast<double>(i) + 0.5);
    int64_t lo = static_cast<int64_t>(std::floor(c - support + 0.5));
    int64_t hi = static_cast<int64_t>(std::floor(c + support + 0.5));
    lo = std::max<int64_t>(lo, 0);
    hi = std::min<int64_t>(hi, clip1 - clip0);
    hi = std::min<int64_t>(hi, lo + t.width);
    if (hi <= lo) {  // the centre lies outside the allowed taps (tiny boxes): nearest edge pixel
      lo = std::min<int64_t>(std::max<int64_t>(lo, 0), clip1 - clip0 - 1);
      hi = lo + 1;
    }
    float* w = t.w.data() + i * t.width;
    float total = 0.f;
    for (int64_t j = lo; j < hi; ++j) {
      w[j - lo] = tri(static_cast<float>((static_cast<double>(j) + 0.5 - c)) * inv);
      total += w[j - lo];
    }
    if (total <= 0.f) {
      for (int64_t j = lo; j < hi; ++j) w[j - lo] = 1.f;
      total = static_cast<float>(hi - lo);
    }
    for (int64_t j = lo; j < hi; ++j) w[j - lo] /= total;
    t.start[i] = lo + clip0 - origin;
    t.count[i] = hi - lo;
  }
  return t;
}

inline uint8_t to_u8(float v) {
  v = v > 0.f ? v : 0.f;
  v = v < 255.f ? v : 255.f;
  return static_cast<uint8_t>(static_cast<int>(v + 0.5f));
}

// Resamples the decoded region into one output sample (strides in elements).
void resample(const Region& r, bool flip, uint8_t* out, int64_t sy, int64_t sx, int64_t sc) {
  const double f = r.scale / 8.0;
  const int C = r.channels;
  const Taps tx = make_taps(r.left * f, r.width * f, r.out_w, r.antialias, r.clip_x0, r.clip_x1,
                            r.buf_x0);
  const Taps ty = make_taps(r.top * f, r.height * f, r.out_h, r.antialias, r.clip_y0, r.clip_y1,
                            r.buf_y0);
  // Vertical pass first, on whole buffer rows (contiguous: the compiler vectorises it), into one
  // float row per output row; then the horizontal pass, mirrored on write.
  const int64_t in_row = r.buf_w * C;
  int64_t x_min = tx.start[0], x_hi = 0;
  for (int64_t x = 0; x < r.out_w; ++x) {
    x_min = std::min(x_min, tx.start[x]);
    x_hi = std::max(x_hi, tx.start[x] + tx.count[x]);
  }
  const int64_t span = (x_hi - x_min) * C;
  std::vector<float> col(static_cast<size_t>(span));
  for (int64_t y = 0; y < r.out_h; ++y) {
    std::fill(col.begin(), col.end(), 0.f);
    const float* w = ty.w.data() + y * ty.width;
    for (int64_t j = 0; j < ty.count[y]; ++j) {
      const uint8_t* src = r.buf + (ty.start[y] + j) * in_row + x_min * C;
      const float wj = w[j];
      float* c = col.data();
      for (int64_t e = 0; e < span; ++e) c[e] += wj * static_cast<float>(src[e]);
    }
    uint8_t* drow = out + y * sy;
    for (int64_t x = 0; x < r.out_w; ++x) {
      const float* wx = tx.w.data() + x * tx.width;
      const float* s = col.data() + (tx.start[x] - x_min) * C;
      const int64_t n = tx.count[x];
      const int64_t ox = flip ? r.out_w - 1 - x : x;
      uint8_t* d = drow + ox * sx;
      if (C == 3) {
        float a0 = 0.f, a1 = 0.f, a2 = 0.f;
        for (int64_t j = 0; j < n; ++j) {
          a0 += wx[j] * s[3 * j];
          a1 += wx[j] * s[3 * j + 1];
          a2 += wx[j] * s[3 * j + 2];
        }
        d[0] = to_u8(a0);
        d[sc] = to_u8(a1);
        d[2 * sc] = to_u8(a2);
      } else {
        float a0 = 0.f;
        for (int64_t j = 0; j < n; ++j) a0 += wx[j] * s[j];
        d[0] = to_u8(a0);
      }
    }
  }
}

// The full-size case without a direct write (CHW, strided or flipped output): a plain copy of the
// decoded image (decode_region decoded all of it: the taps span every row and column).
void copy_full(const Region& r, bool flip, uint8_t* out, int64_t sy, int64_t sx, int64_t sc) {
  const int C = r.channels;
  for (int64_t y = 0; y < r.out_h; ++y) {
    const uint8_t* src = r.buf + (y - r.buf_y0) * r.buf_w * C - r.buf_x0 * C;
    uint8_t* drow = out + y * sy;
    for (int64_t x = 0; x < r.out_w; ++x) {
      uint8_t* d = drow + (flip ? r.out_w - 1 - x : x) * sx;
      for (int c = 0; c < C; ++c) d[c * sc] = src[x * C + c];
    }
  }
}

// Checks decode_jpeg_crops' arguments (each error names the argument, what was expected and what
// came); returns whether offsets are [B, 2] spans (else [B + 1] packed offsets).
bool check_crop_args(const at::Tensor& data, const at::Tensor& offsets, const at::Tensor& boxes,
                     const at::Tensor& flip, const at::Tensor& out, const at::Tensor& errors, bool channels_last,
                     int64_t dct_scale, int64_t threads) {
  const char* op = "gpu_ops.decode_jpeg_crops: ";
  TORCH_CHECK(data.dim() == 1 && data.scalar_type() == at::kByte && data.is_contiguous(), op,
              "expected data as a contiguous 1-D uint8 tensor, got ", data.scalar_type(), " ",
              data.sizes());
  TORCH_CHECK(out.dim() == 4 && out.scalar_type() == at::kByte, op,
              "expected out as a 4-D uint8 tensor, got ", out.scalar_type(), " ", out.sizes());
  const int64_t B = out.size(0);
  const int64_t H = channels_last ? out.size(1) : out.size(2);
  const int64_t W = channels_last ? out.size(2) : out.size(3);
  const int64_t C = channels_last ? out.size(3) : out.size(1);
  TORCH_CHECK(C == 1 || C == 3, op, "expected 1 or 3 channels in out, got ", C);
  TORCH_CHECK(H > 0 && W > 0, op, "expected a non-empty output size, got ", H, "x", W);
  // Either packed records (offsets [B + 1]: record b is data[offsets[b]:offsets[b + 1]]) or spans
  // anywhere in data ([B, 2]: record b is data[offsets[b][0]:offsets[b][1]]), e.g. straight out of
  // a store file's map, where the records are not back to back.
  const bool spans = offsets.dim() == 2;
  TORCH_CHECK(((offsets.dim() == 1 && offsets.size(0) == B + 1) ||
               (spans && offsets.size(0) == B && offsets.size(1) == 2)) &&
                  offsets.scalar_type() == at::kLong && offsets.is_contiguous(),
              op, "expected offsets as contiguous int64 of shape [", B + 1, "] or [", B,
              ", 2], got ", offsets.scalar_type(), " ", offsets.sizes());
  TORCH_CHECK(boxes.dim() == 2 && boxes.size(0) == B && boxes.size(1) == 4 &&
                  boxes.scalar_type() == at::kDouble && boxes.is_contiguous(),
              op, "expected boxes as contiguous float64 of shape [", B, ", 4], got ",
              boxes.scalar_type(), " ", boxes.sizes());
  TORCH_CHECK(flip.dim() == 1 && flip.size(0) == B && flip.scalar_type() == at::kBool &&
                  flip.is_contiguous(),
              op, "expected flip as contiguous bool of shape [", B, "], got ", flip.scalar_type(),
              " ", flip.sizes());
  TORCH_CHECK(errors.dim() == 2 && errors.size(0) == B && errors.size(1) >= 16 &&
                  errors.scalar_type() == at::kByte && errors.is_contiguous(),
              op, "expected errors as contiguous uint8 of shape [", B, ", >=16], got ",
              errors.scalar_type(), " ", errors.sizes());
  TORCH_CHECK(threads >= 0, op, "expected threads >= 0 (0: torch.get_num_threads()), got ", threads);
  TORCH_CHECK(dct_scale == 0 || dct_scale == 1 || dct_scale == 2 || dct_scale == 4 ||
                  dct_scale == 8,
              op, "expected dct_scale 0 (auto), 1, 2, 4 or 8 (eighths), got ", dct_scale);
  for (const auto* t : {&data, &offsets, &boxes, &flip, &out, &errors}) {
    TORCH_CHECK(t->device().is_cpu(), op, "expected CPU tensors, got one on ", t->device());
  }
  const int64_t* off = offsets.const_data_ptr<int64_t>();
  const int64_t step = spans ? 2 : 1;  // record b starts at off[step * b] and ends at the next one
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = off[step * b], end = off[step * b + 1];
    TORCH_CHECK(start >= 0 && start <= end && end <= data.size(0), op,
                "record ", b, " spans bytes [", start, ", ", end, ") outside data's [0, ",
                data.size(0), ") or backwards");
  }
  return spans;
}

void decode_jpeg_crops_cpu(const at::Tensor& data, const at::Tensor& offsets,
                           const at::Tensor& boxes, const at::Tensor& flip, const at::Tensor& out,
                           const at::Tensor& errors, bool channels_last, int64_t dct_scale,
                           bool antialias, bool clip_to_box, bool fast_dct, int64_t threads) {
  const bool spans = check_crop_args(data, offsets, boxes, flip, out, errors, channels_last, dct_scale, threads);
  const int64_t B = out.size(0);
  const int64_t H = channels_last ? out.size(1) : out.size(2);
  const int64_t W = channels_last ? out.size(2) : out.size(3);
  const int64_t C = channels_last ? out.size(3) : out.size(1);
  const int64_t* off = offsets.const_data_ptr<int64_t>();
  const int64_t step = spans ? 2 : 1;  // record b starts at off[step * b] and ends at the next one
  const uint8_t* bytes = data.const_data_ptr<uint8_t>();
  const double* bx = boxes.const_data_ptr<double>();
  const bool* fl = flip.const_data_ptr<bool>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  uint8_t* err = errors.mutable_data_ptr<uint8_t>();
  const int64_t err_len = errors.size(1);
  const int64_t sb = out.stride(0);
  const int64_t sy = channels_last ? out.stride(1) : out.stride(2);
  const int64_t sx = channels_last ? out.stride(2) : out.stride(3);
  const int64_t sc = channels_last ? out.stride(3) : out.stride(1);
  // One sample per grab from a shared counter: images differ in decode time (size, entropy), so
  // a static split leaves a thread idle at the end of the batch. Threads are started per call
  // (tens of microseconds against milliseconds of decode per image) and joined, not taken from
  // ATen's OpenMP pool: in an extension at::parallel_for is OpenMP only when the extension is
  // compiled with -fopenmp (it is not, so it ran serially), and OpenMP's idle threads spin.
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t b = next.fetch_add(1); b < B; b = next.fetch_add(1)) {
      Region r;
      std::memset(&r, 0, sizeof(r));
      r.data = bytes + off[step * b];
      r.size = static_cast<size_t>(off[step * b + 1] - off[step * b]);
      r.top = bx[4 * b];
      r.left = bx[4 * b + 1];
      r.height = bx[4 * b + 2];
      r.width = bx[4 * b + 3];
      r.out_h = H;
      r.out_w = W;
      r.channels = static_cast<int>(C);
      r.forced_scale = static_cast<int>(dct_scale);
      r.antialias = antialias;
      r.clip_to_box = clip_to_box;
      r.fast_dct = fast_dct;
      if (!fl[b] && sc == 1 && sx == C) {  // packed HWC pixels: rows may be written in place
        r.direct = dst + b * sb;
        r.direct_stride = sy;
      }
      char* msg = reinterpret_cast<char*>(err + b * err_len);
      msg[0] = '\0';
      if (r.size == 0) {
        std::snprintf(msg, static_cast<size_t>(err_len), "empty JPEG data (0 bytes)");
        continue;
      }
      if (decode_region(&r) != 0) {
        std::snprintf(msg, static_cast<size_t>(err_len), "%s", r.message[0] ? r.message : "decode failed");
        std::free(r.buf);
        continue;
      }
      if (r.full_size && r.direct != nullptr) continue;  // libjpeg wrote the output rows
      try {  // nothing may escape a worker thread (std::terminate): bad_alloc of the taps
        if (r.full_size) {
          copy_full(r, fl[b], dst + b * sb, sy, sx, sc);
        } else {
          resample(r, fl[b], dst + b * sb, sy, sx, sc);
        }
      } catch (const std::exception& e) {
        std::snprintf(msg, static_cast<size_t>(err_len), "resampling failed: %s", e.what());
      }
      std::free(r.buf);
    }
  };
  // An explicit count lets a caller with several batches in flight (readers.BatchLoader) split
  // the cores between them instead of each batch starting torch.get_num_threads() threads.
  run_on_threads(available_threads(B, threads), work);
}

}  // namespace

TORCH_LIBRARY_IMPL(gpu_ops, CPU, m) {
  m.impl("decode_jpeg_crops", &decode_jpeg_crops_cpu);
}

}  // namespace gpu_ops
