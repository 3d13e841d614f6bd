// Per-pixel arithmetic shared by the CPU (.cpp) and CUDA (.cu) kernels, so both compute the same
// function with the same operation order. Everything here is header-only and host/device.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace gpu_ops {

// Values of the integer `interpolation` / `mode` arguments of the schemas.
constexpr int64_t kNearest = 0;
constexpr int64_t kBilinear = 1;
constexpr int64_t kResizeBilinear = 0;
constexpr int64_t kResizeArea = 1;

// Accumulator type: double for double, float for everything else (uint8, half, bfloat16, float).
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

// Float arithmetic with every rounding spelled out. nvcc fuses a * b + c into one fma (its default
// -fmad=true) wherever its optimizer meets the pattern, and where it meets it depends on the code
// around an inlined call: the per-pixel and per-channel resampling below, the same arithmetic,
// came out a few ulps apart on the GPU. The resampling functions use these instead of operators:
// on the GPU the _rn intrinsics (never fused), on the CPU plain operators (its kernels are built
// with -ffp-contract=off), so every kernel, CPU or CUDA, computes the same bits.
C10_HOST_DEVICE inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
C10_HOST_DEVICE inline float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
C10_HOST_DEVICE inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
C10_HOST_DEVICE inline double add_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
C10_HOST_DEVICE inline double mul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Converts an accumulator to the storage type: uint8 saturates and rounds half up (the value is
// non-negative once clamped, so truncation of v + 0.5 is floor(v + 0.5)); floats just convert.
template <typename T, typename A>
C10_HOST_DEVICE inline T to_out(A v) {
  if constexpr (std::is_same<T, uint8_t>::value) {
    v = v > A(0) ? v : A(0);  // also maps NaN to 0
    v = v < A(255) ? v : A(255);
    return static_cast<uint8_t>(static_cast<int>(v + A(0.5)));
  } else {
    return static_cast<T>(v);
  }
}

// The border / fill value as T; uint8 follows OpenCV's saturate_cast<uchar>(double): round half
// to even, then clamp. Host only.
template <typename T>
inline T fill_as(double fill) {
  if constexpr (std::is_same<T, uint8_t>::value) {
    const double r = std::nearbyint(fill);
    return static_cast<uint8_t>(r < 0.0 ? 0.0 : (r > 255.0 ? 255.0 : r));
  } else {
    return static_cast<T>(fill);
  }
}

template <typename T>
C10_HOST_DEVICE inline float to_float(T v) {
  return static_cast<float>(v);
}

// Double arithmetic that the compiler may not contract into FMA: OpenCV rounds (M1*y + M2)*1024
// to an integer, and a fused multiply-add can land on the other side of a rounding boundary.
C10_HOST_DEVICE inline double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
C10_HOST_DEVICE inline double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
// Round half to even, as OpenCV's cvRound / saturate_cast<int>(double).
C10_HOST_DEVICE inline int64_t rint64(double v) {
#if defined(__CUDA_ARCH__)
  return __double2ll_rn(v);
#else
  return std::llrint(v);
#endif
}

// ---------------------------------------------------------------------------------------------
// warp_affine: cv2.warpAffine(..., flags=INTER_LINEAR|WARP_INVERSE_MAP, BORDER_CONSTANT), bit-exact
// for uint8. OpenCV (imgwarp.cpp, WarpAffineInvoker) maps output pixel (x, y) to input coordinates
// in fixed point: AB_BITS = 10 for the affine terms, then INTER_BITS = 5 (1/32 pixel) for the
// bilinear weights; nearest rounds to the closest pixel. M maps output -> input pixel centres
// (integer coordinates are pixel centres, no half-pixel offset).
// ---------------------------------------------------------------------------------------------
struct WarpCoord {
  int64_t x;   // integer input column of the top-left tap (nearest: the tap)
  int64_t y;
  int32_t fx;  // bilinear: fractional parts in 1/32 pixel, 0..31
  int32_t fy;
};

// The three steps of OpenCV's coordinate arithmetic, split so the CUDA kernel can tabulate the
// per-column and per-row terms once: X = row term(y) + column term(x), in 1/1024 pixel.
C10_HOST_DEVICE inline int64_t warp_col_term(double m, int64_t x) {
  return rint64(dmul(dmul(m, static_cast<double>(x)), 1024.0));
}
C10_HOST_DEVICE inline int64_t warp_row_term(double m1, double m2, int64_t y, bool nearest) {
  const int64_t round_delta = nearest ? 512 : 16;
  return rint64(dmul(dadd(dmul(m1, static_cast<double>(y)), m2), 1024.0)) + round_delta;
}
C10_HOST_DEVICE inline WarpCoord warp_finish(int64_t X, int64_t Y, bool nearest) {
  WarpCoord c;
  if (nearest) {
    c.x = X >> 10;  // arithmetic shift == floor division, also for negative values
    c.y = Y >> 10;
    c.fx = 0;
    c.fy = 0;
  } else {
    X >>= 5;
    Y >>= 5;
    c.x = X >> 5;
    c.y = Y >> 5;
    c.fx = static_cast<int32_t>(X & 31);
    c.fy = static_cast<int32_t>(Y & 31);
  }
  return c;
}

C10_HOST_DEVICE inline WarpCoord warp_coord(const double* M, int64_t x, int64_t y, bool nearest) {
  return warp_finish(warp_row_term(M[1], M[2], y, nearest) + warp_col_term(M[0], x),
                     warp_row_term(M[4], M[5], y, nearest) + warp_col_term(M[3], x), nearest);
}

// One channel of one output pixel; `s` is the channel's H x W plane.
template <typename T>
C10_HOST_DEVICE inline T warp_sample(const T* s, int64_t H, int64_t W, const WarpCoord& c,
                                     bool nearest, T fill) {
  if (nearest) {
    const bool ok = c.x >= 0 && c.x < W && c.y >= 0 && c.y < H;
    return ok ? s[c.y * W + c.x] : fill;
  }
  const bool x0ok = c.x >= 0 && c.x < W, x1ok = c.x + 1 >= 0 && c.x + 1 < W;
  const bool y0ok = c.y >= 0 && c.y < H, y1ok = c.y + 1 >= 0 && c.y + 1 < H;
  const int64_t o00 = c.y * W + c.x;
  const T v00 = (y0ok && x0ok) ? s[o00] : fill;
  const T v01 = (y0ok && x1ok) ? s[o00 + 1] : fill;
  const T v10 = (y1ok && x0ok) ? s[o00 + W] : fill;
  const T v11 = (y1ok && x1ok) ? s[o00 + W + 1] : fill;
  const int32_t w00 = (32 - c.fx) * (32 - c.fy), w01 = c.fx * (32 - c.fy);
  const int32_t w10 = (32 - c.fx) * c.fy, w11 = c.fx * c.fy;
  if constexpr (std::is_same<T, uint8_t>::value) {
    // OpenCV: weights in 1/32768 (INTER_REMAP_COEF_BITS); with 1/32 fractions they are exact
    // multiples of 32, so (sum * 32 + 2^14) >> 15 == (sum + 512) >> 10.
    const int32_t s32 = int32_t(v00) * w00 + int32_t(v01) * w01 + int32_t(v10) * w10 +
                        int32_t(v11) * w11;
    return static_cast<uint8_t>((s32 + 512) >> 10);
  } else {
    using A = acc_t<T>;
    const A k = A(1) / A(1024);
    const A acc = static_cast<A>(v00) * (A(w00) * k) + static_cast<A>(v01) * (A(w01) * k) +
                  static_cast<A>(v10) * (A(w10) * k) + static_cast<A>(v11) * (A(w11) * k);
    return static_cast<T>(acc);
  }
}

// One output pixel, all channels (CPU kernel). src/dst point at the sample's first element;
// planes are contiguous (NCHW). `fill` is already converted to T.
template <typename T>
C10_HOST_DEVICE inline void warp_affine_pixel(const T* src, T* dst, int64_t C, int64_t H, int64_t W,
                                              int64_t out_plane, const WarpCoord& c, bool nearest,
                                              T fill) {
  for (int64_t ch = 0; ch < C; ++ch) {
    dst[ch * out_plane] = warp_sample<T>(src + ch * H * W, H, W, c, nearest, fill);
  }
}

// ---------------------------------------------------------------------------------------------
// Resampling windows, the same as ATen's upsample kernels (align_corners=False):
// bilinear: triangle filter centred at scale * (i + 0.5) in input pixels; with antialias and
// downscaling (scale > 1) the filter is stretched by `scale` (PyTorch's antialias=True, PIL's
// BILINEAR reduce); otherwise the window is the 2 taps of plain bilinear. Weights are normalised
// over the taps inside the input, which reproduces ATen's edge clamping.
// area: ATen's adaptive average pooling window [floor(i*in/out), ceil((i+1)*in/out)).
// ---------------------------------------------------------------------------------------------
struct Axis {
  int64_t start;
  int64_t size;
  float center;
  float invscale;
  float norm;
  bool area;
};

C10_HOST_DEVICE inline float tri(float x) {
  x = x < 0.f ? -x : x;
  return x < 1.f ? sub_rn(1.f, x) : 0.f;
}

C10_HOST_DEVICE inline Axis make_axis(bool area, bool antialias, int64_t in_size, int64_t out_size,
                                      int64_t i) {
  Axis a;
  a.area = area;
  if (area) {
    a.start = (i * in_size) / out_size;
    const int64_t end = ((i + 1) * in_size + out_size - 1) / out_size;
    a.size = end - a.start;
    a.center = 0.f;
    a.invscale = 1.f;
    a.norm = 1.f / static_cast<float>(a.size);
    return a;
  }
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  const bool aa = antialias && scale > 1.f;
  const float support = aa ? scale : 1.f;
  a.invscale = aa ? 1.f / scale : 1.f;
  a.center = mul_rn(scale, add_rn(static_cast<float>(i), 0.5f));
  int64_t lo = static_cast<int64_t>(add_rn(sub_rn(a.center, support), 0.5f));
  int64_t hi = static_cast<int64_t>(add_rn(add_rn(a.center, support), 0.5f));
  lo = lo < 0 ? 0 : lo;
  hi = hi > in_size ? in_size : hi;
  a.start = lo;
  a.size = hi > lo ? hi - lo : 0;
  float total = 0.f;
  for (int64_t j = 0; j < a.size; ++j) {
    total = add_rn(total, tri(mul_rn(add_rn(sub_rn(static_cast<float>(j + lo), a.center), 0.5f),
                                     a.invscale)));
  }
  a.norm = total > 0.f ? 1.f / total : 0.f;
  return a;
}

C10_HOST_DEVICE inline float axis_weight(const Axis& a, int64_t j) {
  if (a.area) return a.norm;
  return mul_rn(
      tri(mul_rn(add_rn(sub_rn(static_cast<float>(j + a.start), a.center), 0.5f), a.invscale)),
      a.norm);
}

// Plain bilinear (2 taps), ATen's upsample_bilinear2d with align_corners=False: source coordinate
// scale * (i + 0.5) - 0.5 clamped at 0, taps i0 and min(i0 + 1, in - 1). The same function as the
// window above when it has 2 taps, with fewer operations; used unless the filter is widened.
struct Lin {
  int64_t i0, i1;
  float w0, w1;
};

C10_HOST_DEVICE inline Lin linear_axis(int64_t in_size, int64_t out_size, int64_t i) {
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  float src = sub_rn(mul_rn(scale, add_rn(static_cast<float>(i), 0.5f)), 0.5f);
  src = src > 0.f ? src : 0.f;
  Lin l;
  l.i0 = static_cast<int64_t>(src);  // src >= 0: truncation is floor
  l.i0 = l.i0 < in_size - 1 ? l.i0 : in_size - 1;
  l.i1 = l.i0 < in_size - 1 ? l.i0 + 1 : l.i0;
  l.w1 = sub_rn(src, static_cast<float>(l.i0));
  l.w1 = l.w1 < 1.f ? l.w1 : 1.f;
  l.w0 = sub_rn(1.f, l.w1);
  return l;
}

// True when (in_size -> out_size) resampling is plain bilinear: no area mode, and no antialias
// widening (antialias only changes downscaling).
C10_HOST_DEVICE inline bool is_linear(bool area, bool antialias, int64_t in_size, int64_t out_size) {
  return !area && (!antialias || in_size <= out_size);
}

template <typename T, typename A>
C10_HOST_DEVICE inline A sample_linear(const T* src, int64_t sy, int64_t sx, const Lin& ly,
                                       const Lin& lx) {
  const T* r0 = src + ly.i0 * sy;
  const T* r1 = src + ly.i1 * sy;
  const A top = add_rn(mul_rn(static_cast<A>(lx.w0), static_cast<A>(r0[lx.i0 * sx])),
                       mul_rn(static_cast<A>(lx.w1), static_cast<A>(r0[lx.i1 * sx])));
  const A bot = add_rn(mul_rn(static_cast<A>(lx.w0), static_cast<A>(r1[lx.i0 * sx])),
                       mul_rn(static_cast<A>(lx.w1), static_cast<A>(r1[lx.i1 * sx])));
  return add_rn(mul_rn(static_cast<A>(ly.w0), top), mul_rn(static_cast<A>(ly.w1), bot));
}

// Weighted sum over the separable window; `src` points at (row 0, col 0) of one channel, rows
// `sy` and columns `sx` elements apart.
template <typename T, typename A>
C10_HOST_DEVICE inline A sample_window(const T* src, int64_t sy, int64_t sx, const Axis& ay,
                                       const Axis& ax) {
  A acc = A(0);
  for (int64_t j = 0; j < ay.size; ++j) {
    const T* row = src + (ay.start + j) * sy + ax.start * sx;
    A racc = A(0);
    for (int64_t i = 0; i < ax.size; ++i) {
      const A w = static_cast<A>(axis_weight(ax, i));
      racc = add_rn(racc, mul_rn(w, static_cast<A>(row[i * sx])));
    }
    acc = add_rn(acc, mul_rn(static_cast<A>(axis_weight(ay, j)), racc));
  }
  return acc;
}

// Crop box [top, left, height, width] clipped to an H x W image (at least 1 x 1).
struct Box {
  int64_t top, left, height, width;
};
C10_HOST_DEVICE inline Box clip_box(const int64_t* b, int64_t H, int64_t W) {
  Box r;
  r.top = b[0] < 0 ? 0 : (b[0] > H - 1 ? H - 1 : b[0]);
  r.left = b[1] < 0 ? 0 : (b[1] > W - 1 ? W - 1 : b[1]);
  const int64_t hmax = H - r.top, wmax = W - r.left;
  r.height = b[2] < 1 ? 1 : (b[2] > hmax ? hmax : b[2]);
  r.width = b[3] < 1 ? 1 : (b[3] > wmax ? wmax : b[3]);
  return r;
}

// ---------------------------------------------------------------------------------------------
// adjust_color: torchvision.transforms.v2.functional semantics on values in [0, 1], applied in the
// fixed order brightness, contrast, saturation, hue (ColorJitter draws a random order).
// ---------------------------------------------------------------------------------------------
C10_HOST_DEVICE inline float clamp01(float v) {
  return v < 0.f ? 0.f : (v > 1.f ? 1.f : v);
}
C10_HOST_DEVICE inline float gray(float r, float g, float b) {
  return 0.2989f * r + 0.587f * g + 0.114f * b;
}

// torchvision's _rgb_to_hsv / _hsv_to_rgb with the hue shifted by `hue` (mod 1).
C10_HOST_DEVICE inline void shift_hue(float& r, float& g, float& b, float hue) {
  const float maxc = fmaxf(r, fmaxf(g, b));
  const float minc = fminf(r, fminf(g, b));
  const bool eqc = maxc == minc;
  const float cr = maxc - minc;
  const float s = cr / (eqc ? 1.f : maxc);
  const float div = eqc ? 1.f : cr;
  const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
  float h;
  if (maxc == r) {
    h = bc - gc;
  } else if (maxc == g) {
    h = 2.f + rc - bc;
  } else {
    h = 4.f + gc - rc;
  }
  h = fmodf(h * (1.f / 6.f) + 1.f, 1.f);
  h = h + hue;
  h = h - floorf(h);  // Python-style remainder by 1
  const float v = maxc;
  const float h6 = h * 6.f;
  const float fi = floorf(h6);
  const float f = h6 - fi;
  int i = static_cast<int>(fi) % 6;
  i = i < 0 ? i + 6 : i;
  const float sxv = s * v;
  const float p = clamp01(v - sxv);
  const float q = clamp01(v - sxv * f);
  const float t = clamp01(sxv * f + p);
  switch (i) {
    case 0: r = v; g = t; b = p; break;
    case 1: r = q; g = v; b = p; break;
    case 2: r = p; g = v; b = t; break;
    case 3: r = p; g = q; b = v; break;
    case 4: r = t; g = p; b = v; break;
    default: r = v; g = p; b = q; break;
  }
}

// Brightness, then contrast against `mean` (the grey mean of the brightness-adjusted image),
// saturation, hue. Values in [0, 1].
C10_HOST_DEVICE inline void color_pixel(float& r, float& g, float& b, float bf, float cf, float sf,
                                        float hf, float mean) {
  r = clamp01(r * bf);
  g = clamp01(g * bf);
  b = clamp01(b * bf);
  const float cm = (1.f - cf) * mean;
  r = clamp01(cf * r + cm);
  g = clamp01(cf * g + cm);
  b = clamp01(cf * b + cm);
  const float gr = (1.f - sf) * gray(r, g, b);
  r = clamp01(sf * r + gr);
  g = clamp01(sf * g + gr);
  b = clamp01(sf * b + gr);
  if (hf != 0.f) shift_hue(r, g, b, hf);
}

// ---------------------------------------------------------------------------------------------
// Ragged batches: images of different sizes packed into one 1-D buffer. index[b] = (offset,
// height, width) in elements; every image has the same C channels, stored HWC (channels last, as
// libjpeg-turbo decodes) or CHW (channels first, as nvJPEG / torchvision decode).
// ---------------------------------------------------------------------------------------------
struct RaggedView {
  int64_t offset;  // first element of the image in the packed buffer
  int64_t H, W;
  int64_t sy, sx, sc;  // element strides of a row, a column and a channel
  bool ok;             // offset, size and shape lie inside the buffer (else: the sample is filled)
};

C10_HOST_DEVICE inline RaggedView ragged_view(const int64_t* index, int64_t b, int64_t C,
                                              bool channels_first, int64_t numel) {
  RaggedView v;
  v.offset = index[3 * b];
  v.H = index[3 * b + 1];
  v.W = index[3 * b + 2];
  v.ok = v.offset >= 0 && v.H >= 1 && v.W >= 1 && v.offset + v.H * v.W * C <= numel;
  if (channels_first) {
    v.sy = v.W;
    v.sx = 1;
    v.sc = v.H * v.W;
  } else {
    v.sy = v.W * C;
    v.sx = C;
    v.sc = 1;
  }
  return v;
}

// warp_sample for a plane with row stride sy and column stride sx (elements).
template <typename T>
C10_HOST_DEVICE inline T warp_sample_strided(const T* s, int64_t H, int64_t W, int64_t sy,
                                             int64_t sx, const WarpCoord& c, bool nearest,
                                             T fill) {
  if (nearest) {
    const bool ok = c.x >= 0 && c.x < W && c.y >= 0 && c.y < H;
    return ok ? s[c.y * sy + c.x * sx] : fill;
  }
  const bool x0ok = c.x >= 0 && c.x < W, x1ok = c.x + 1 >= 0 && c.x + 1 < W;
  const bool y0ok = c.y >= 0 && c.y < H, y1ok = c.y + 1 >= 0 && c.y + 1 < H;
  const int64_t o00 = c.y * sy + c.x * sx;
  const T v00 = (y0ok && x0ok) ? s[o00] : fill;
  const T v01 = (y0ok && x1ok) ? s[o00 + sx] : fill;
  const T v10 = (y1ok && x0ok) ? s[o00 + sy] : fill;
  const T v11 = (y1ok && x1ok) ? s[o00 + sy + sx] : fill;
  const int32_t w00 = (32 - c.fx) * (32 - c.fy), w01 = c.fx * (32 - c.fy);
  const int32_t w10 = (32 - c.fx) * c.fy, w11 = c.fx * c.fy;
  if constexpr (std::is_same<T, uint8_t>::value) {
    const int32_t s32 = int32_t(v00) * w00 + int32_t(v01) * w01 + int32_t(v10) * w10 +
                        int32_t(v11) * w11;
    return static_cast<uint8_t>((s32 + 512) >> 10);
  } else {
    using A = acc_t<T>;
    const A k = A(1) / A(1024);
    const A acc = static_cast<A>(v00) * (A(w00) * k) + static_cast<A>(v01) * (A(w01) * k) +
                  static_cast<A>(v10) * (A(w10) * k) + static_cast<A>(v11) * (A(w11) * k);
    return static_cast<T>(acc);
  }
}

// One output value of a per-sample resampling (bilinear, antialiased or area) of one channel
// plane `s` (H x W, strides sy, sx) to out_h x out_w at output (y, x).
template <typename T, typename A>
C10_HOST_DEVICE inline A resample_at(const T* s, int64_t sy, int64_t sx, int64_t H, int64_t W,
                                     int64_t out_h, int64_t out_w, int64_t y, int64_t x,
                                     bool area, bool antialias) {
  if (is_linear(area, antialias, W, out_w) && is_linear(area, antialias, H, out_h)) {
    return sample_linear<T, A>(s, sy, sx, linear_axis(H, out_h, y), linear_axis(W, out_w, x));
  }
  return sample_window<T, A>(s, sy, sx, make_axis(area, antialias, H, out_h, y),
                             make_axis(area, antialias, W, out_w, x));
}

// The per-pixel forms below give every channel of one output pixel at once, for images of up to
// kPixelChannels channels, channel c starting sc elements after channel 0. Per channel they do
// the arithmetic of sample_window / resample_at bit for bit (the same weights, the same sums in
// the same order); what they save is the work those repeat per channel and per window row: the
// two axes, and each column's weight (computed once for the pixel, up to kPixelTaps columns;
// wider windows fall back to sample_window per channel). A kernel with one thread per output
// pixel spends most of its time there when it downscales with antialiasing.
constexpr int kPixelChannels = 4;
constexpr int kPixelTaps = 32;

template <typename T, typename A>
C10_HOST_DEVICE inline void sample_window_pixel(const T* src, int64_t sy, int64_t sx, int64_t sc,
                                                int64_t C, const Axis& ay, const Axis& ax,
                                                A* out) {
  if (ax.size > kPixelTaps) {
    for (int64_t c = 0; c < C; ++c) out[c] = sample_window<T, A>(src + c * sc, sy, sx, ay, ax);
    return;
  }
  float wx[kPixelTaps];
  for (int64_t i = 0; i < ax.size; ++i) wx[i] = axis_weight(ax, i);
  A acc[kPixelChannels];
#pragma unroll
  for (int c = 0; c < kPixelChannels; ++c) acc[c] = A(0);
  for (int64_t j = 0; j < ay.size; ++j) {
    const T* row = src + (ay.start + j) * sy + ax.start * sx;
    A racc[kPixelChannels];
#pragma unroll
    for (int c = 0; c < kPixelChannels; ++c) racc[c] = A(0);
    for (int64_t i = 0; i < ax.size; ++i) {
      const A w = static_cast<A>(wx[i]);
#pragma unroll
      for (int c = 0; c < kPixelChannels; ++c) {
        if (c < C) racc[c] = add_rn(racc[c], mul_rn(w, static_cast<A>(row[i * sx + c * sc])));
      }
    }
    const A wy = static_cast<A>(axis_weight(ay, j));
#pragma unroll
    for (int c = 0; c < kPixelChannels; ++c) {
      if (c < C) acc[c] = add_rn(acc[c], mul_rn(wy, racc[c]));
    }
  }
#pragma unroll
  for (int c = 0; c < kPixelChannels; ++c) {
    if (c < C) out[c] = acc[c];
  }
}

// resample_at for the C <= kPixelChannels channels of output pixel (y, x), into out[0 .. C).
template <typename T, typename A>
C10_HOST_DEVICE inline void resample_pixel(const T* s, int64_t sy, int64_t sx, int64_t sc, int64_t C,
                                           int64_t H, int64_t W, int64_t out_h, int64_t out_w,
                                           int64_t y, int64_t x, bool area, bool antialias,
                                           A* out) {
  if (is_linear(area, antialias, W, out_w) && is_linear(area, antialias, H, out_h)) {
    const Lin ly = linear_axis(H, out_h, y), lx = linear_axis(W, out_w, x);
#pragma unroll
    for (int c = 0; c < kPixelChannels; ++c) {
      if (c < C) out[c] = sample_linear<T, A>(s + c * sc, sy, sx, ly, lx);
    }
    return;
  }
  sample_window_pixel<T, A>(s, sy, sx, sc, C, make_axis(area, antialias, H, out_h, y),
                            make_axis(area, antialias, W, out_w, x), out);
}

}  // namespace gpu_ops
