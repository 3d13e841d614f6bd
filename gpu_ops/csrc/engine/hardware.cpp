// See hardware.h.
#include "hardware.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "header.h"

namespace packer_engine {

HardwareLanes::HardwareLanes(bool wanted) {
  if (!wanted) {
    reason_ = "hardware_share is 0";
    return;
  }
  nvjpegStatus_t s = nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &handle_);
  if (s != NVJPEG_STATUS_SUCCESS) {
    handle_ = nullptr;
    reason_ = std::string("no hardware JPEG engine: nvJPEG ") + nvjpeg_status_name(s);
    return;
  }
  // PACKER_ENGINE_HW_LANES: host threads (and decoder states) the hardware share is split over.
  const long lanes = std::max(1L, std::min(8L, env_long("PACKER_ENGINE_HW_LANES", kHwLanes)));
  // PACKER_ENGINE_HW_PREALLOCATE=0: no nvjpegDecodeBatchedPreAllocate (it turns on nvJPEG's
  // memory pool for the hardware backend instead of allocating and freeing per batch).
  const bool preallocate = env_long("PACKER_ENGINE_HW_PREALLOCATE", 1) != 0;
  for (long l = 0; l < lanes; ++l) {
    auto lane = std::make_unique<HwLane>();
    NVJ(nvjpegJpegStateCreate(handle_, &lane->state));
    if (preallocate) {
      nvjpegStatus_t p = nvjpegDecodeBatchedPreAllocate(handle_, lane->state, 1, 1, 1, NVJPEG_CSS_444,
                                                        NVJPEG_OUTPUT_RGBI);
      if (p != NVJPEG_STATUS_SUCCESS)
        notes_ = std::string("nvjpegDecodeBatchedPreAllocate: nvJPEG ") + nvjpeg_status_name(p);
    }
    CUDA_OK(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&lane->done, cudaEventDisableTiming));
    lanes_.push_back(std::move(lane));
  }
}

HardwareLanes::~HardwareLanes() {
  for (auto& lane : lanes_) {
    if (lane->stream) cudaStreamSynchronize(lane->stream);
    for (auto p : lane->params) nvjpegDecodeParamsDestroy(p);
    if (lane->state) nvjpegJpegStateDestroy(lane->state);
    if (lane->stream) cudaStreamDestroy(lane->stream);
    if (lane->done) cudaEventDestroy(lane->done);
  }
  lanes_.clear();
  if (handle_) nvjpegDestroy(handle_);
}

std::vector<int64_t> HardwareLanes::decoder_info() const {
  unsigned int engines = 0, cores = 0;
  if (handle_ != nullptr && nvjpegGetHardwareDecoderInfo(handle_, &engines, &cores) != NVJPEG_STATUS_SUCCESS)
    engines = cores = 0;
  return {int64_t(engines), int64_t(cores)};
}

int64_t HardwareLanes::failures() const {
  std::lock_guard<std::mutex> g(error_m_);
  return failures_;
}

std::string HardwareLanes::last_error() const {
  std::lock_guard<std::mutex> g(error_m_);
  return last_error_;
}

bool HardwareLanes::busy() const {
  for (auto& lane : lanes_)
    if (lane->where.load() != kIdle) return true;
  return false;
}

std::string HardwareLanes::where_report() const {
  std::ostringstream m;
  if (lanes_.empty()) m << "none";
  for (size_t l = 0; l < lanes_.size(); ++l) m << (l == 0 ? "" : ", ") << where_name(lanes_[l]->where.load());
  return m.str();
}

std::vector<int> HardwareLanes::wheres() const {
  std::vector<int> w;
  for (auto& lane : lanes_) w.push_back(lane->where.load(std::memory_order_relaxed));
  return w;
}

std::vector<std::vector<int>> HardwareLanes::split(const std::vector<Image>& images,
                                                   const std::vector<int>& hw) const {
  std::vector<std::vector<int>> parts;
  if (hw.empty()) return parts;
  double total = 0.0;
  for (int i : hw) total += double(images[size_t(i)].height * images[size_t(i)].width);
  const size_t lanes = total / double(hw.size()) > kLaneMaxPixels
                           ? 1
                           : std::max<size_t>(1, std::min(lanes_.size(), hw.size() / kMinLaneImages));
  parts.resize(lanes);
  double acc = 0.0;
  for (int i : hw) {
    size_t l = std::min(lanes - 1, size_t(acc / total * double(lanes)));
    parts[l].push_back(i);
    acc += double(images[size_t(i)].height * images[size_t(i)].width);
  }
  std::vector<std::vector<int>> nonempty;
  for (auto& p : parts)
    if (!p.empty()) nonempty.push_back(std::move(p));
  return nonempty;
}

// The batched call itself: nvjpegDecodeBatchedInitialize, then nvjpegDecodeBatched, or
// nvjpegDecodeBatchedEx with per-image parameters where an image has a window. *call names the
// call that returned the status.
nvjpegStatus_t HardwareLanes::call_batched(HwLane& lane, std::vector<Image>& images, const std::vector<int>& which,
                                           uint8_t* out, const char** call) {
  const int n = int(which.size());
  std::vector<const unsigned char*> datas(static_cast<size_t>(n));
  std::vector<size_t> lengths(static_cast<size_t>(n));
  std::vector<nvjpegImage_t> dst(static_cast<size_t>(n));
  bool windows = false;
  for (int k = 0; k < n; ++k) {
    const Image& im = images[size_t(which[size_t(k)])];
    datas[size_t(k)] = im.data;
    lengths[size_t(k)] = im.length;
    std::memset(&dst[size_t(k)], 0, sizeof(nvjpegImage_t));
    dst[size_t(k)].channel[0] = out + im.offset;
    dst[size_t(k)].pitch[0] = size_t(im.out_w * 3);
    windows = windows || im.roi;
  }
  // Windows: per-image parameters (nvjpegDecodeBatchedEx), created once and kept.
  while (windows && lane.params.size() < size_t(n)) {
    nvjpegDecodeParams_t p = nullptr;
    NVJ(nvjpegDecodeParamsCreate(handle_, &p));
    lane.params.push_back(p);
  }
  if (windows)
    for (int k = 0; k < n; ++k) set_params(lane.params[size_t(k)], images[size_t(which[size_t(k)])]);
  nvjpegStatus_t s;
  *call = "nvjpegDecodeBatchedInitialize";
  {
    At at(lane.where, kHwInitialize);
    s = nvjpegDecodeBatchedInitialize(handle_, lane.state, n, 1, NVJPEG_OUTPUT_RGBI);
  }
  TRACE("hardware lane: initialized for %d images", n);
  if (s == NVJPEG_STATUS_SUCCESS) {
    At at(lane.where, kHwDecode);
    *call = windows ? "nvjpegDecodeBatchedEx" : "nvjpegDecodeBatched";
    s = windows ? nvjpegDecodeBatchedEx(handle_, lane.state, datas.data(), lengths.data(), dst.data(),
                                        lane.params.data(), lane.stream)
                : nvjpegDecodeBatched(handle_, lane.state, datas.data(), lengths.data(), dst.data(), lane.stream);
  }
  return s;
}

int64_t HardwareLanes::decode(HwLane& lane, int device, cudaEvent_t ready, std::vector<Image>& images,
                              const std::vector<int>& which, uint8_t* out) {
  // A new thread: make the device's context current on it before nvJPEG allocates (CUDAGuard
  // skips cudaSetDevice when the index already matches; nvJPEG's hardware backend then fails
  // with "allocator failure" on a thread with no current context).
  CUDA_OK(cudaSetDevice(device));
  c10::cuda::CUDAGuard guard(device);
  {
    At at(lane.where, kWaitOutput);
    const auto t_wait = std::chrono::steady_clock::now();
    wait_for_output(ready);
    TRACE("hardware lane: output memory free after %.2f ms",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_wait).count());
  }
  const int n = int(which.size());
  const char* call = "";
  const nvjpegStatus_t s = call_batched(lane, images, which, out, &call);
  if (s != NVJPEG_STATUS_SUCCESS) {  // the whole batch goes to the threads
    {
      std::lock_guard<std::mutex> g(error_m_);
      ++failures_;
      last_error_ = std::string(call) + " (hardware backend, " + std::to_string(n) + " images): nvJPEG " +
                    nvjpeg_status_name(s) + " (" + std::to_string(int(s)) + ")";
    }
    for (int i : which) {
      images[size_t(i)].status = kDecodeFailed;
      images[size_t(i)].message = std::string("hardware batch: nvJPEG ") + nvjpeg_status_name(s);
    }
    return 0;
  }
  return n;
}

HardwareBatch::HardwareBatch(HardwareLanes& hw, int device, cudaEvent_t ready, std::vector<Image>& images,
                             std::vector<std::vector<int>> parts, uint8_t* out)
    : hw_(hw), parts_(std::move(parts)) {
  try {
    start(device, ready, images, out);
  } catch (...) {  // a thread that could not start: join the ones that did before unwinding
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    throw;
  }
}

void HardwareBatch::start(int device, cudaEvent_t ready, std::vector<Image>& images, uint8_t* out) {
  for (size_t l = 0; l < parts_.size(); ++l) {
    HwLane* lane = &hw_.lane(l);
    lane->error = nullptr;
    lane->decoded = 0;
    lane->ms = 0.0;
    const std::vector<int>* which = &parts_[l];
    threads_.emplace_back([this, lane, l, which, device, ready, &images, out] {
      try {
        const auto t_hw = std::chrono::steady_clock::now();
        TRACE("hardware batch of %zu (lane %zu)", which->size(), l);
        lane->decoded = hw_.decode(*lane, device, ready, images, *which, out);
        lane->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_hw).count();
        TRACE("hardware batch done (lane %zu)", l);
      } catch (...) {
        lane->error = std::current_exception();
      }
    });
  }
}

HardwareBatch::~HardwareBatch() {
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

int64_t HardwareBatch::finish(double* ms) {
  int64_t by_hw = 0;
  *ms = 0.0;
  std::exception_ptr error;
  for (size_t l = 0; l < parts_.size(); ++l) {
    HwLane& lane = hw_.lane(l);
    if (threads_[l].joinable()) threads_[l].join();
    if (lane.error && !error) error = lane.error;
    by_hw += lane.decoded;
    *ms = std::max(*ms, lane.ms);
  }
  if (error) std::rethrow_exception(error);
  return by_hw;
}

void HardwareBatch::join_streams(cudaStream_t caller) {
  for (size_t l = 0; l < parts_.size(); ++l) {
    HwLane& lane = hw_.lane(l);
    CUDA_OK(cudaEventRecord(lane.done, lane.stream));
    CUDA_OK(cudaStreamWaitEvent(caller, lane.done, 0));
  }
}

}  // namespace packer_engine
