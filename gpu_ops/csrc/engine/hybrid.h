// The threads' decode: nvJPEG's decoupled API on each pool thread, one decoder state, two JPEG
// streams and pinned buffers and one CUDA stream per thread. The Huffman stage runs on the thread
// (NVJPEG_BACKEND_HYBRID) or on the GPU for large images (GPU_HYBRID, as DALI does above its
// hybrid_huffman_threshold); then the transfer and the IDCT/colour stage on the thread's stream,
// straight into the image's slot of the output.
#pragma once

#include <nvjpeg.h>

#include <atomic>
#include <cstdint>

#include "common.h"

namespace packer_engine {

// What the threads share: nvJPEG's handle, the two decoders, the device and when to use the GPU
// for the Huffman stage. Owned by the Engine.
struct HostDecoders {
  int device = 0;
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegDecoder_t decoders[2] = {nullptr, nullptr};  // [hybrid, gpu_hybrid]
  int64_t gpu_huffman_px = 0;                            // above: the Huffman stage on the GPU
  cudaEvent_t ready = nullptr;                           // the output's memory is free (wait_for_output)
};

// One pool thread's state.
struct Worker {
  nvjpegJpegStream_t stream[2] = {nullptr, nullptr};  // full parse, one per pinned slot
  nvjpegJpegStream_t header = nullptr;                // header pass
  nvjpegJpegState_t state[2] = {nullptr, nullptr};  // [hybrid, gpu_hybrid]
  nvjpegBufferPinned_t pinned[2] = {nullptr, nullptr};
  cudaEvent_t pinned_free[2] = {nullptr, nullptr};  // the transfer out of pinned[k] is done
  bool pinned_used[2] = {false, false};
  int next_pinned = 0;
  nvjpegBufferDevice_t device_buf = nullptr;
  nvjpegDecodeParams_t params = nullptr;
  cudaStream_t cuda = nullptr;
  cudaEvent_t done = nullptr;
  bool used = false;  // decoded something in this call (waited for the output's memory)
  std::atomic<int>* where = nullptr;  // the engine's record of the call this thread is in
};

// Creates a thread's nvJPEG and CUDA state (on that thread).
void init_worker(const HostDecoders& d, Worker& w);
// Frees it (after the thread has stopped).
void destroy_worker(Worker& w);
// Decodes one image into out + im.offset; a failure is recorded in im (status, message).
void decode_hybrid(const HostDecoders& d, Worker& w, Image& im, uint8_t* out);

}  // namespace packer_engine
