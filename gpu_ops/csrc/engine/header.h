// Header reading: the first pass over a batch, one nvjpegJpegStreamParseHeader per image (its
// size, components and precision, whether the hardware JPEG decoder takes it), and the window
// decoded (a region asked for, clipped to the image).
#pragma once

#include <nvjpeg.h>

#include "common.h"

namespace packer_engine {

// Reads im's header with the thread's `header` stream and sets its size, window, status and
// hardware_ok. hw_handle: the hardware JPEG decoder's handle, or nullptr where there is none
// (then no image is hardware_ok); `params` is scratch for asking it about a window.
void read_header(nvjpegHandle_t handle, nvjpegHandle_t hw_handle, nvjpegJpegStream_t header,
                 nvjpegDecodeParams_t params, Image& im);

// The size decoded: the window asked for, clipped to the image, or the whole image.
void set_window(Image& im);

// Decode parameters for one image: RGB interleaved, its window or the whole image.
void set_params(nvjpegDecodeParams_t params, const Image& im);

}  // namespace packer_engine
