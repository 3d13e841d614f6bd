// See hybrid.h.
#include "hybrid.h"

#include <c10/cuda/CUDAGuard.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "header.h"

namespace packer_engine {
namespace {

// The pool threads' waits for their pinned slots sleep (blocking sync) rather than spin: with
// 12-16 decoder threads on a 16-core host, spinning waits could take cores from the Huffman stage
// and the loader's Python (measured on an H100: no difference either way within the noise).
// PACKER_ENGINE_SPIN_WAITS=1 restores spinning (for measuring the two).
unsigned pinned_event_flags() {
  static const bool spin = [] {
    const char* v = std::getenv("PACKER_ENGINE_SPIN_WAITS");
    return v != nullptr && v[0] == '1';
  }();
  return spin ? cudaEventDisableTiming : (cudaEventDisableTiming | cudaEventBlockingSync);
}

// PACKER_ENGINE_TEST_STALL_S: the threads' decode sleeps this long per image (tests the watchdog).
void stall_for_test() {
  static const double stall_s = [] {
    const char* v = std::getenv("PACKER_ENGINE_TEST_STALL_S");
    return v ? std::atof(v) : 0.0;
  }();
  if (stall_s > 0.0) std::this_thread::sleep_for(std::chrono::duration<double>(stall_s));
}

// GPU Huffman (decoder 1) for large images, where that decoder takes the stream (not progressive
// ones); else the thread's own (decoder 0).
int choose_decoder(const HostDecoders& d, Worker& w, const Image& im, nvjpegJpegStream_t jstream) {
  if (im.height * im.width <= d.gpu_huffman_px) return 0;
  int unsupported = 1;
  if (nvjpegDecoderJpegSupported(d.decoders[1], jstream, w.params, &unsupported) != NVJPEG_STATUS_SUCCESS ||
      unsupported != 0)
    return 0;
  return 1;
}

// The Huffman stage, the transfer and the device stage of one parsed image.
nvjpegStatus_t decode_parsed(const HostDecoders& d, Worker& w, const Image& im, nvjpegJpegStream_t jstream,
                             int slot, uint8_t* out) {
  const int k = choose_decoder(d, w, im, jstream);
  nvjpegJpegState_t state = w.state[k];
  nvjpegImage_t dst;
  std::memset(&dst, 0, sizeof(dst));
  dst.channel[0] = out + im.offset;
  dst.pitch[0] = size_t(im.out_w * 3);
  nvjpegStatus_t s = nvjpegStateAttachPinnedBuffer(state, w.pinned[slot]);
  if (s == NVJPEG_STATUS_SUCCESS) {
    At at(*w.where, kDecodeHost);
    s = nvjpegDecodeJpegHost(d.handle, d.decoders[k], state, w.params, jstream);
    stall_for_test();
  }
  if (s == NVJPEG_STATUS_SUCCESS && !w.used) {
    At at(*w.where, kWaitOutput);
    wait_for_output(d.ready);
    w.used = true;
  }
  if (s == NVJPEG_STATUS_SUCCESS) {
    At at(*w.where, kTransfer);
    s = nvjpegDecodeJpegTransferToDevice(d.handle, d.decoders[k], state, jstream, w.cuda);
  }
  if (s == NVJPEG_STATUS_SUCCESS) {
    CUDA_OK(cudaEventRecord(w.pinned_free[slot], w.cuda));
    w.pinned_used[slot] = true;
    At at(*w.where, kDecodeDevice);
    s = nvjpegDecodeJpegDevice(d.handle, d.decoders[k], state, &dst, w.cuda);
  }
  return s;
}

}  // namespace

void init_worker(const HostDecoders& d, Worker& w) {
  c10::cuda::CUDAGuard guard(d.device);
  for (int k = 0; k < 2; ++k) NVJ(nvjpegJpegStreamCreate(d.handle, &w.stream[k]));
  NVJ(nvjpegJpegStreamCreate(d.handle, &w.header));
  for (int k = 0; k < 2; ++k) {
    NVJ(nvjpegDecoderStateCreate(d.handle, d.decoders[k], &w.state[k]));
    NVJ(nvjpegBufferPinnedCreate(d.handle, nullptr, &w.pinned[k]));
    CUDA_OK(cudaEventCreateWithFlags(&w.pinned_free[k], pinned_event_flags()));
  }
  NVJ(nvjpegBufferDeviceCreate(d.handle, nullptr, &w.device_buf));
  for (int k = 0; k < 2; ++k) NVJ(nvjpegStateAttachDeviceBuffer(w.state[k], w.device_buf));
  NVJ(nvjpegDecodeParamsCreate(d.handle, &w.params));
  NVJ(nvjpegDecodeParamsSetOutputFormat(w.params, NVJPEG_OUTPUT_RGBI));
  NVJ(nvjpegDecodeParamsSetROI(w.params, 0, 0, -1, -1));
  NVJ(nvjpegDecodeParamsSetAllowCMYK(w.params, 1));
  CUDA_OK(cudaStreamCreateWithFlags(&w.cuda, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&w.done, cudaEventDisableTiming));
}

void destroy_worker(Worker& w) {
  if (w.cuda) cudaStreamSynchronize(w.cuda);
  for (int k = 0; k < 2; ++k) {
    if (w.state[k]) nvjpegJpegStateDestroy(w.state[k]);
    if (w.pinned[k]) nvjpegBufferPinnedDestroy(w.pinned[k]);
    if (w.pinned_free[k]) cudaEventDestroy(w.pinned_free[k]);
  }
  if (w.device_buf) nvjpegBufferDeviceDestroy(w.device_buf);
  for (auto st : w.stream)
    if (st) nvjpegJpegStreamDestroy(st);
  if (w.header) nvjpegJpegStreamDestroy(w.header);
  if (w.params) nvjpegDecodeParamsDestroy(w.params);
  if (w.done) cudaEventDestroy(w.done);
  if (w.cuda) cudaStreamDestroy(w.cuda);
}

void decode_hybrid(const HostDecoders& d, Worker& w, Image& im, uint8_t* out) {
  c10::cuda::CUDAGuard guard(d.device);
  // Two slots (JPEG stream + pinned buffer) per thread: this image's Huffman stage overlaps the
  // previous image's transfer; a slot is reused once the transfer out of it has finished.
  const int slot = w.next_pinned;
  w.next_pinned ^= 1;
  if (w.pinned_used[slot]) {
    At at(*w.where, kWaitPinned);
    CUDA_OK(cudaEventSynchronize(w.pinned_free[slot]));
  }
  nvjpegJpegStream_t jstream = w.stream[slot];
  nvjpegStatus_t s;
  {
    At at(*w.where, kParse);
    s = nvjpegJpegStreamParse(d.handle, im.data, im.length, 0, 0, jstream);
  }
  if (s != NVJPEG_STATUS_SUCCESS) {
    im.status = kDecodeFailed;
    im.message = std::string("parse: nvJPEG ") + nvjpeg_status_name(s);
    return;
  }
  set_params(w.params, im);
  s = decode_parsed(d, w, im, jstream, slot, out);
  if (s != NVJPEG_STATUS_SUCCESS) {
    im.status = kDecodeFailed;
    im.message = std::string("decode: nvJPEG ") + nvjpeg_status_name(s);
  }
}

}  // namespace packer_engine
