// The hardware JPEG decoder (nvJPEG's hardware backend: A100, H100, H200; absent on most other
// GPUs) and its lanes. A lane is a decoder state, a CUDA stream and, per batch, a host thread that
// makes one batched call. Several lanes split a batch's hardware share and run at once: for small
// images one hardware batch call at a time is bound by its host thread (about one core), for large
// ones the hardware decoder itself is the limit and one lane is faster (see kHwLanes).
#pragma once

#include <nvjpeg.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace packer_engine {

struct HwLane {
  nvjpegJpegState_t state = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  std::vector<nvjpegDecodeParams_t> params;  // one per image (windows), created once and kept
  std::atomic<int> where{0};
  std::exception_ptr error;
  int64_t decoded = 0;
  double ms = 0.0;
};

class HardwareLanes {
 public:
  // Hardware lanes: two, used for images of at most kLaneMaxPixels on average; larger ones go to
  // one lane. Measured on an H100 (docs/benchmarks/vs_dali.md, session 7): two lanes took the
  // hardware decoder alone from ~22k to ~31k ~500 px images/s (one call at a time is bound by its
  // host thread there), but at 1080p, where the hardware decoder itself is the limit (~5.8k/s),
  // two lanes slowed it to ~5.0k and three to ~4.5k.
  static constexpr long kHwLanes = 2;
  // The hardware images in parts for the lanes: contiguous runs of about equal pixels, at least
  // kMinLaneImages images each (fewer lanes for a small share), one lane for large images.
  static constexpr size_t kMinLaneImages = 16;

  // Opens the hardware backend where `wanted` (hardware_share > 0) and the GPU has one; else
  // available() is false and reason() says why. Call with the device current.
  explicit HardwareLanes(bool wanted);
  // Waits for the lanes' streams and frees everything (never while a lane may be stuck: the
  // engine leaks the object instead).
  ~HardwareLanes();

  bool available() const { return handle_ != nullptr; }
  nvjpegHandle_t handle() const { return handle_; }
  const std::string& reason() const { return reason_; }
  const std::string& notes() const { return notes_; }  // a pre-allocation nvJPEG refused
  size_t size() const { return lanes_.size(); }
  HwLane& lane(size_t l) { return *lanes_[l]; }
  // nvjpegGetHardwareDecoderInfo: (engines, cores per engine); (0, 0) without the hardware decoder.
  std::vector<int64_t> decoder_info() const;
  // Hardware batches that failed as a whole (their images were decoded on the threads), and why
  // the last one did.
  int64_t failures() const;
  std::string last_error() const;
  // Whether a lane's thread is inside a call; "nvjpegDecodeBatched, idle" (or "none").
  bool busy() const;
  std::string where_report() const;
  std::vector<int> wheres() const;  // each lane's Where now

  // The images `hw` (indices into images) in parts, one per lane used.
  std::vector<std::vector<int>> split(const std::vector<Image>& images, const std::vector<int>& hw) const;
  // Decodes images `which` into out on lane `lane` (after waiting for `ready`); returns how many.
  // A failed batch call marks its images kDecodeFailed (the threads then decode them) and returns 0.
  int64_t decode(HwLane& lane, int device, cudaEvent_t ready, std::vector<Image>& images,
                 const std::vector<int>& which, uint8_t* out);

 private:
  nvjpegStatus_t call_batched(HwLane& lane, std::vector<Image>& images, const std::vector<int>& which,
                              uint8_t* out, const char** call);
  nvjpegHandle_t handle_ = nullptr;
  std::vector<std::unique_ptr<HwLane>> lanes_;
  std::string reason_, notes_;
  mutable std::mutex error_m_;
  int64_t failures_ = 0;
  std::string last_error_;
};

// One batch's hardware share, decoded on threads of their own (one per lane) while the pool
// decodes the rest. The threads are joined on every way out (an error on the pool's side must not
// leave a joinable thread).
class HardwareBatch {
 public:
  HardwareBatch(HardwareLanes& hw, int device, cudaEvent_t ready, std::vector<Image>& images,
                std::vector<std::vector<int>> parts, uint8_t* out);
  ~HardwareBatch();
  size_t lanes() const { return parts_.size(); }
  // Joins the lanes' threads; returns the images they decoded and sets *ms to the longest lane's
  // host time. Rethrows the first lane's error.
  int64_t finish(double* ms);
  // The caller's stream waits for the lanes' streams.
  void join_streams(cudaStream_t caller);

 private:
  void start(int device, cudaEvent_t ready, std::vector<Image>& images, uint8_t* out);
  HardwareLanes& hw_;
  std::vector<std::vector<int>> parts_;
  std::vector<std::thread> threads_;
};

}  // namespace packer_engine
