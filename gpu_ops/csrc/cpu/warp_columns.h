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
  std::vector<int64_t> cx, cy;
  int64_t sample = -1;

  // Tabulate the column terms of sample `b` (M: its 2x3 matrix), unless they already are.
  void set(const double* M, int64_t b, int64_t out_w) {
    if (b == sample) return;
    sample = b;
    cx.resize(static_cast<size_t>(out_w));
    cy.resize(static_cast<size_t>(out_w));
    for (int64_t x = 0; x < out_w; ++x) {
      cx[x] = warp_col_term(M[0], x);
      cy[x] = warp_col_term(M[3], x);
    }
  }

  // The input coordinate of output pixel x in the row whose terms are (rx, ry).
  WarpCoord at(int64_t x, int64_t rx, int64_t ry, bool nearest) const {
    return warp_finish(rx + cx[x], ry + cy[x], nearest);
  }
};

}  // namespace gpu_ops
