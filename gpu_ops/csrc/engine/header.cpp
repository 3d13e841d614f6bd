// See header.h.
#include "header.h"

#include <algorithm>
#include <sstream>
#include <string>

namespace packer_engine {
namespace {

// Whether the hardware JPEG decoder takes this (three-component, 8-bit) image, window included.
bool hardware_takes(nvjpegHandle_t hw_handle, nvjpegJpegStream_t header, nvjpegDecodeParams_t params,
                    const Image& im) {
  int unsupported = 1;
  nvjpegStatus_t s;
  if (im.roi) {  // the hardware decoder's support for a window
    set_params(params, im);
    s = nvjpegDecodeBatchedSupportedEx(hw_handle, header, params, &unsupported);
  } else {
    s = nvjpegDecodeBatchedSupported(hw_handle, header, &unsupported);
  }
  return s == NVJPEG_STATUS_SUCCESS && unsupported == 0;
}

}  // namespace

void read_header(nvjpegHandle_t handle, nvjpegHandle_t hw_handle, nvjpegJpegStream_t header,
                 nvjpegDecodeParams_t params, Image& im) {
  im.status = kOk;
  im.message.clear();
  im.hardware_ok = im.to_hardware = false;
  nvjpegStatus_t s = nvjpegJpegStreamParseHeader(handle, im.data, im.length, header);
  if (s != NVJPEG_STATUS_SUCCESS) {
    im.status = kBadHeader;
    im.message = std::string("header does not parse (nvJPEG ") + nvjpeg_status_name(s) + ")";
    return;
  }
  unsigned int width = 0, height = 0, comps = 0, precision = 8;
  nvjpegJpegStreamGetFrameDimensions(header, &width, &height);
  nvjpegJpegStreamGetComponentsNum(header, &comps);
  nvjpegJpegStreamGetSamplePrecision(header, &precision);
  nvjpegChromaSubsampling_t css = NVJPEG_CSS_UNKNOWN;
  nvjpegJpegStreamGetChromaSubsampling(header, &css);
  if (width == 0 || height == 0) {
    im.status = kBadHeader;
    im.message = "header gives a zero size";
    return;
  }
  im.width = width;
  im.height = height;
  set_window(im);
  const bool cmyk = comps == 4;  // Adobe CMYK/YCCK: the threads' decoders convert it (AllowCMYK)
  if (!(comps == 1 || comps == 3 || cmyk) || precision != 8 || (css == NVJPEG_CSS_UNKNOWN && !cmyk)) {
    im.status = kUnsupported;
    std::ostringstream m;
    m << comps << " components, " << precision << "-bit";
    im.message = m.str();
    return;
  }
  // Grayscale goes to the threads: the hardware decoder's RGBI output of a one-component JPEG
  // is wrong (measured on an H200 with nvJPEG 13: mean error 47 levels against libjpeg-turbo).
  if (hw_handle != nullptr && comps == 3) im.hardware_ok = hardware_takes(hw_handle, header, params, im);
}

void set_window(Image& im) {
  im.roi = false;
  im.out_h = im.height;
  im.out_w = im.width;
  if (im.roi_h <= 0 || im.roi_w <= 0) return;
  const int64_t top = std::max<int64_t>(0, std::min(im.roi_top, im.height));
  const int64_t left = std::max<int64_t>(0, std::min(im.roi_left, im.width));
  const int64_t bottom = std::min(im.height, std::max(im.roi_top + im.roi_h, top));
  const int64_t right = std::min(im.width, std::max(im.roi_left + im.roi_w, left));
  if (bottom <= top || right <= left) return;  // nothing of it inside: the whole image
  if (top == 0 && left == 0 && bottom == im.height && right == im.width) return;
  im.roi = true;
  im.roi_top = top;
  im.roi_left = left;
  im.out_h = bottom - top;
  im.out_w = right - left;
}

void set_params(nvjpegDecodeParams_t params, const Image& im) {
  NVJ(nvjpegDecodeParamsSetOutputFormat(params, NVJPEG_OUTPUT_RGBI));
  if (im.roi) {
    NVJ(nvjpegDecodeParamsSetROI(params, int(im.roi_left), int(im.roi_top), int(im.out_w), int(im.out_h)));
  } else {
    NVJ(nvjpegDecodeParamsSetROI(params, 0, 0, -1, -1));
  }
}

}  // namespace packer_engine
