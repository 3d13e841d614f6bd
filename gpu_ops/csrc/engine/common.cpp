// See common.h.
#include "common.h"

#include <chrono>
#include <cstdlib>

namespace packer_engine {

const char* nvjpeg_status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    default: return "unknown status";
  }
}

const bool kTrace = [] {
  const char* v = std::getenv("PACKER_ENGINE_TRACE");
  return v != nullptr && v[0] == '1';
}();

double trace_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0') ? x : fallback;
}

const char* where_name(int w) {
  switch (w) {
    case kIdle: return "idle";
    case kParseHeader: return "nvjpegJpegStreamParseHeader";
    case kWaitPinned: return "waiting for a pinned buffer's transfer (cudaEventSynchronize)";
    case kParse: return "nvjpegJpegStreamParse";
    case kDecodeHost: return "nvjpegDecodeJpegHost";
    case kTransfer: return "nvjpegDecodeJpegTransferToDevice";
    case kDecodeDevice: return "nvjpegDecodeJpegDevice";
    case kWaitOutput: return "waiting for the output's memory to be free (cudaEventSynchronize)";
    case kHwInitialize: return "nvjpegDecodeBatchedInitialize";
    case kHwDecode: return "nvjpegDecodeBatched";
    default: return "unknown";
  }
}

const char* stage_name(int stage) {
  switch (stage) {
    case 0: return "nothing (the batch was never started)";
    case 1: return "the header pass (thread pool)";
    case 2: return "allocating the output (CUDA caching allocator)";
    case 3: return "the threads' nvJPEG decode";
    case 4: return "waiting for the hardware JPEG engine's batch";
    case 5: return "the index copy and stream events";
    default: return "an unknown stage";
  }
}

void wait_for_output(cudaEvent_t ready) { CUDA_OK(cudaEventSynchronize(ready)); }

}  // namespace packer_engine
