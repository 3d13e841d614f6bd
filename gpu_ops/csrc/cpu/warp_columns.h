// The per-column terms of OpenCV's warpAffine coordinates for one sample, tabulated for the CPU
// kernels (as the CUDA kernel does): warp_coord(M, x, y) recomputes them for every pixel (four
// llrint calls per pixel); with the table, a pixel costs two integer additions and warp_finish.
// warp_finish(row term(y) + column term(x)) is exactly warp_coord: the same integers are summed.
#pragma once

#include <cstdint>
#include <vector>

#include "../common.h"

namespace gpu_ops {

struct WarpColumns {
  std::vector<int64_t> cx, cy;  // column terms of `sample`
  int64_t sample = -1;
  int64_t rx = 0, ry = 0;       // row terms of the current row
  bool nearest = false;

  // Move to row y of sample b (M: its 2x3 matrix); its column terms are tabulated when b changes.
  void row(const double* M, int64_t b, int64_t y, int64_t out_w, bool nearest_) {
    if (b != sample) {
      sample = b;
      cx.resize(static_cast<size_t>(out_w));
      cy.resize(static_cast<size_t>(out_w));
      for (int64_t x = 0; x < out_w; ++x) {
        cx[x] = warp_col_term(M[0], x);
        cy[x] = warp_col_term(M[3], x);
      }
    }
    nearest = nearest_;
    rx = warp_row_term(M[1], M[2], y, nearest);
    ry = warp_row_term(M[4], M[5], y, nearest);
  }

  // The input coordinate of output pixel x in the current row: warp_coord(M, x, y, nearest).
  WarpCoord at(int64_t x) const { return warp_finish(rx + cx[x], ry + cy[x], nearest); }
};

}  // namespace gpu_ops
