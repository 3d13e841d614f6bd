// crop_mirror_normalize's CPU row, shared by the dense and the ragged kernel: uint8 in, so
// (v - mean) * (1 / std) takes one of 256 values per channel, tabulated with the same float
// operations as the per-pixel formula (the same results), and only the columns that read inside
// the image are looked up; the rest of the row is fill.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace gpu_ops {

// table[c * 256 + v] = (v - mean[c]) * inv[c], rounded to T.
template <typename T>
std::vector<T> normalize_table(const float* mean, const float* inv, int64_t C) {
  std::vector<T> table(static_cast<size_t>(C) * 256);
  for (int64_t c = 0; c < C; ++c) {
    for (int v = 0; v < 256; ++v) {
      table[c * 256 + v] = static_cast<T>((static_cast<float>(v) - mean[c]) * inv[c]);
    }
  }
  return table;
}

// One channel of one output row, d[0, Wp): output column x < out_w reads source column
// left + x (left + out_w - 1 - x when flipped) of row `s` (that channel's pixel 0; columns `sx`
// elements apart, W of them) through `table` (that channel's 256 entries); columns reading
// outside the image, the padding beyond out_w and a row outside the image (row_in false) get fill.
template <typename T>
void crop_normalize_row(T* d, int64_t Wp, const uint8_t* s, int64_t sx, int64_t W, int64_t left,
                        int64_t out_w, bool flipped, bool row_in, const T* table, T fill) {
  int64_t x0 = 0, x1 = 0;  // output columns [x0, x1) read inside the image
  if (row_in) {
    x0 = flipped ? std::max<int64_t>(0, left + out_w - W) : std::max<int64_t>(0, -left);
    x1 = flipped ? std::min<int64_t>(out_w, left + out_w) : std::min<int64_t>(out_w, W - left);
    x1 = std::max(x0, x1);
  }
  for (int64_t x = 0; x < x0; ++x) d[x] = fill;
  if (flipped) {
    const uint8_t* p = s + (left + out_w - 1 - x0) * sx;
    for (int64_t x = x0; x < x1; ++x, p -= sx) d[x] = table[*p];
  } else {
    const uint8_t* p = s + (left + x0) * sx;
    for (int64_t x = x0; x < x1; ++x, p += sx) d[x] = table[*p];
  }
  for (int64_t x = x1; x < Wp; ++x) d[x] = fill;
}

}  // namespace gpu_ops
