// Separable resampling of one crop box for the CPU kernels: the same sums as
// sample_linear / sample_window of ../common.h (the same weights, the same order of additions),
// computed as a horizontal pass per input row, kept and reused by every output row whose window
// holds that row, then a vertical pass. Per output pixel the window of ../common.h costs
// taps_y * taps_x multiply-adds and as many weight evaluations; this costs taps_x + taps_y and
// reads precomputed weights.
//
// Same order of additions: sample_window sums each input row over x first (racc, from 0), then
// the rows over y (acc, from 0); sample_linear is the 2-tap case (top, bottom) whose first
// addition to 0 is exact. Both are reproduced here term by term.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../common.h"

namespace gpu_ops {

// The taps of one resampling direction: output i reads input indices idx[i * taps + j] with
// weights w[i * taps + j], j < size[i].
struct AxisTable {
  int64_t taps = 0;
  std::vector<int64_t> idx;
  std::vector<float> w;
  std::vector<int64_t> size;
};

// `linear`: the 2-tap plain bilinear of sample_linear (chosen jointly for both axes, as
// resample_at does); else the (antialiased) window of make_axis/axis_weight.
inline AxisTable axis_table(bool linear, bool antialias, int64_t in, int64_t out) {
  AxisTable t;
  t.size.resize(static_cast<size_t>(out));
  if (linear) {
    t.taps = 2;
    t.idx.resize(static_cast<size_t>(2 * out));
    t.w.resize(static_cast<size_t>(2 * out));
    for (int64_t i = 0; i < out; ++i) {
      const Lin l = linear_axis(in, out, i);
      t.idx[2 * i] = l.i0;
      t.idx[2 * i + 1] = l.i1;
      t.w[2 * i] = l.w0;
      t.w[2 * i + 1] = l.w1;
      t.size[i] = 2;
    }
    return t;
  }
  std::vector<Axis> axes(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    axes[i] = make_axis(false, antialias, in, out, i);
    t.taps = std::max(t.taps, axes[i].size);
  }
  t.taps = std::max<int64_t>(t.taps, 1);
  t.idx.assign(static_cast<size_t>(t.taps * out), 0);
  t.w.assign(static_cast<size_t>(t.taps * out), 0.f);
  for (int64_t i = 0; i < out; ++i) {
    t.size[i] = axes[i].size;
    for (int64_t j = 0; j < axes[i].size; ++j) {
      t.idx[i * t.taps + j] = axes[i].start + j;
      t.w[i * t.taps + j] = axis_weight(axes[i], j);
    }
  }
  return t;
}

// Resamples output rows [y0, y1) (all < out_h) of one box to `out_w` columns, all channels.
// src: the box's top-left pixel, element strides sy (rows), sx (columns), sc (channels).
// xs: the table for output columns (x of the output reads column table entry xmap[x], e.g. the
// mirrored one). emit(y, c, x, value) receives every resampled value. `rows` is scratch.
template <typename Emit>
void resample_box_rows(const uint8_t* src, int64_t sy, int64_t sx, int64_t sc, int64_t C,
                       const AxisTable& ys, const AxisTable& xs, const int64_t* xmap,
                       int64_t out_w, int64_t y0, int64_t y1, std::vector<float>& rows,
                       const Emit& emit) {
  if (y1 <= y0) return;
  // Input rows the window of rows [y0, y1) touches (the tables' indices are sorted per row).
  int64_t lo = INT64_MAX, hi = -1;
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t j = 0; j < ys.size[y]; ++j) {
      lo = std::min(lo, ys.idx[y * ys.taps + j]);
      hi = std::max(hi, ys.idx[y * ys.taps + j]);
    }
  }
  if (hi < lo) {  // empty windows (cannot happen for a clipped box): zeros, as sample_window gives
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t x = 0; x < out_w; ++x) emit(y, c, x, 0.f);
    return;
  }
  const int64_t n = hi - lo + 1;
  rows.resize(static_cast<size_t>(n * C * out_w));
  // Horizontal pass: racc of sample_window (or top/bottom of sample_linear) per input row.
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = src + (lo + r) * sy;
    for (int64_t c = 0; c < C; ++c) {
      float* o = rows.data() + (r * C + c) * out_w;
      const uint8_t* rc = row + c * sc;
      for (int64_t x = 0; x < out_w; ++x) {
        const int64_t e = xmap[x];
        const int64_t* ix = xs.idx.data() + e * xs.taps;
        const float* wx = xs.w.data() + e * xs.taps;
        float racc = 0.f;
        for (int64_t i = 0; i < xs.size[e]; ++i) racc += wx[i] * static_cast<float>(rc[ix[i] * sx]);
        o[x] = racc;
      }
    }
  }
  // Vertical pass: acc of sample_window (or the bottom line of sample_linear), per x in the same
  // order of additions, all x of a row at once.
  std::vector<float> acc(static_cast<size_t>(out_w));
  for (int64_t y = y0; y < y1; ++y) {
    const int64_t* iy = ys.idx.data() + y * ys.taps;
    const float* wy = ys.w.data() + y * ys.taps;
    for (int64_t c = 0; c < C; ++c) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < ys.size[y]; ++j) {
        const float wj = wy[j];
        const float* r = rows.data() + ((iy[j] - lo) * C + c) * out_w;
        for (int64_t x = 0; x < out_w; ++x) acc[x] += wj * r[x];
      }
      for (int64_t x = 0; x < out_w; ++x) emit(y, c, x, acc[x]);
    }
  }
}

// One sample's resampling of its box to (out_h, out_w), mirrored when `flip`: the tables of both
// directions (plain bilinear or window, chosen jointly as resample_at does) and the scratch rows,
// kept across the samples of a parallel_for chunk.
struct BoxResampler {
  AxisTable ys, xs;
  std::vector<int64_t> xmap;
  std::vector<float> scratch;

  void set(bool antialias, int64_t box_h, int64_t box_w, int64_t out_h, int64_t out_w, bool flip) {
    const bool linear = is_linear(false, antialias, box_w, out_w) &&
                        is_linear(false, antialias, box_h, out_h);
    ys = axis_table(linear, antialias, box_h, out_h);
    xs = axis_table(linear, antialias, box_w, out_w);
    xmap.resize(static_cast<size_t>(out_w));
    for (int64_t x = 0; x < out_w; ++x) xmap[x] = flip ? out_w - 1 - x : x;
  }

  // Output rows [y0, y1) of the box at `src` (strides sy, sx, sc; C channels) to emit(y, c, x, v).
  template <typename Emit>
  void rows(const uint8_t* src, int64_t sy, int64_t sx, int64_t sc, int64_t C, int64_t y0, int64_t y1,
            const Emit& emit) {
    resample_box_rows(src, sy, sx, sc, C, ys, xs, xmap.data(), static_cast<int64_t>(xmap.size()), y0, y1,
                      scratch, emit);
  }
};

}  // namespace gpu_ops
