// What every part of the native decoder shares: nvJPEG and CUDA error checks, the trace, settings
// from the environment, the per-image record (Image) and its status codes, and the names of the
// calls a thread can be in (for the watchdog's message).
//
// Words (docs/architecture.md, "Glossary"): the *native decoder* is all of csrc/engine (class
// Engine, the pybind name kept); the *hardware JPEG decoder* is nvJPEG's hardware backend
// (A100/H100/H200), driven through *lanes* (hardware.h); the *threads* are the pool's (pool.h),
// each decoding with nvJPEG's decoupled API (hybrid.h).
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace packer_engine {

// ------------------------------------------------------------------------------------- errors
const char* nvjpeg_status_name(nvjpegStatus_t s);

struct NvjpegError : std::runtime_error {
  nvjpegStatus_t status;
  NvjpegError(const std::string& what, nvjpegStatus_t s)
      : std::runtime_error(what + ": nvJPEG " + nvjpeg_status_name(s) + " (" + std::to_string(int(s)) + ")"),
        status(s) {}
};

#define NVJ(call)                                                   \
  do {                                                              \
    nvjpegStatus_t s_ = (call);                                     \
    if (s_ != NVJPEG_STATUS_SUCCESS) throw NvjpegError(#call, s_);  \
  } while (0)

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    TORCH_CHECK(e_ == cudaSuccess, "packer engine: ", #call, ": ", cudaGetErrorString(e_)); \
  } while (0)

// PACKER_ENGINE_TRACE=1: one stderr line per stage of every batch (where a stuck batch stopped).
extern const bool kTrace;
// Milliseconds on a monotonic clock (a batch's stages line up across threads).
double trace_ms();
#define TRACE(...)                                                 \
  do {                                                             \
    if (::packer_engine::kTrace) {                                 \
      std::fprintf(stderr, "packer engine: %.3f ", ::packer_engine::trace_ms()); \
      std::fprintf(stderr, __VA_ARGS__);                           \
      std::fputc('\n', stderr);                                    \
    }                                                              \
  } while (0)

// An integer setting from the environment (read when an engine is made, so one process can compare two).
long env_long(const char* name, long fallback);

// Images over this many pixels on average go to one hardware lane, and the balancer equalizes
// times for them (see hardware.h, balancer.h). Measured on an H100 (docs/benchmarks/vs_dali.md).
constexpr double kLaneMaxPixels = 1 << 20;

// ------------------------------------------------------------------------------------ images
// Per-image status codes (mirrored in readers/gpu/engine.py).
enum Status : int32_t {
  kOk = 0,
  kBadHeader = 1,      // the header does not parse: damaged or not a JPEG
  kUnsupported = 2,    // parses, but nvJPEG cannot decode it to RGB (e.g. CMYK, 12-bit): CPU fallback
  kDecodeFailed = 3,   // nvJPEG failed on the data: CPU fallback decides whether it is damaged
};

// One image of a batch: its bytes, what the header pass found, where it goes, how it went.
struct Image {
  const unsigned char* data = nullptr;
  size_t length = 0;
  int64_t height = 0, width = 0, offset = 0;  // the whole image's size (from the header)
  // The window asked for (roi_h <= 0: the whole image) and, after the header pass, the size decoded.
  int64_t roi_top = 0, roi_left = 0, roi_h = 0, roi_w = 0;
  int64_t out_h = 0, out_w = 0;
  bool roi = false;  // a window (clipped to the image) is decoded
  bool hardware_ok = false, to_hardware = false;
  int32_t status = kOk;
  std::string message;
};

// ------------------------------------------------------------------------------ where threads are
// Where each decoder thread is (for the watchdog's message): a stuck batch names the call it is in.
enum Where : int {
  kIdle = 0,
  kParseHeader,
  kWaitPinned,
  kParse,
  kDecodeHost,
  kTransfer,
  kDecodeDevice,
  kWaitOutput,
  kHwInitialize,
  kHwDecode,
  kWhereCount
};
const char* where_name(int w);

// Sets a thread's Where for the scope of one call.
struct At {
  std::atomic<int>& slot;
  At(std::atomic<int>& s, int w) : slot(s) { slot.store(w, std::memory_order_relaxed); }
  ~At() { slot.store(kIdle, std::memory_order_relaxed); }
};

// The stage a batch is in (Engine::stage_), by number.
const char* stage_name(int stage);

// The batch's output may be memory the caller's stream used until this batch was queued (the
// caching allocator hands it out on that stream). Every thread that writes it first waits on the
// host for the caller's stream to pass that point (the `ready` event), instead of making its
// stream wait on the GPU: the hardware decoder's batch call blocks its thread inside nvJPEG, and a
// GPU-side wait of the native decoder's streams on the caller's stream deadlocked a training run
// in the CUDA driver (ResNet-50 on an H100 and an H200: the GPU idle, a kernel launch spinning on
// a full queue, the training thread's launch waiting for the driver's lock). On the host nothing
// can wait on work that waits on it. Cheap: the caller's stream is the loader's decode stream,
// which holds only the previous batch's tail.
void wait_for_output(cudaEvent_t ready);

}  // namespace packer_engine
