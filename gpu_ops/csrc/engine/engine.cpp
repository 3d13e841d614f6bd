// packer's native JPEG engine: the host side of a GPU decode batch in C++, out of the GIL.
//
// One call decodes a batch of JPEG byte strings (views into the reader's pinned buffers) into one
// packed HWC uint8 buffer on the GPU (a gpu_ops RaggedBatch: data + (offset, height, width) rows):
//
//   1. header pass, on the thread pool: nvjpegJpegStreamParseHeader per image (size, components,
//      whether the hardware JPEG engine takes it); the output is allocated once for the batch;
//   2. the hardware share (a fraction of the engine-capable images, by pixels) goes to the hardware
//      backend: nvjpegDecodeBatched calls on threads of their own, one per lane (two lanes for
//      images of up to ~1 Mpx, one for larger: see kHwLanes), each with its decoder state and stream;
//   3. every other image is decoded on the pool with nvJPEG's decoupled API, one decoder state,
//      JPEG stream, two pinned buffers and one CUDA stream per thread: the Huffman stage on the
//      thread (NVJPEG_BACKEND_HYBRID) or on the GPU for large images (GPU_HYBRID, as DALI does
//      above its hybrid_huffman_threshold), then the transfer and the IDCT/colour stage on the
//      thread's stream, straight into the image's slot of the output;
//   4. the caller's stream waits on an event of every stream used (no host synchronisation).
//
// A batch may name a window per image (``regions``: top, left, height, width), the crop a train
// pipeline drew from the stored sizes before decoding: only that window is decoded and stored
// (nvjpegDecodeParamsSetROI on the threads, nvjpegDecodeBatchedEx with per-image parameters on the
// hardware engine, where nvjpegDecodeBatchedSupportedEx accepts it). A window reaching outside the
// image (a stored size that does not match the header) is clipped to it; the index says the size
// decoded.
//
// Images nvJPEG rejects are reported per image (status + message) for the Python side to decode
// with libjpeg-turbo or to raise naming the record; nothing here is a JPEG decoder of its own.
#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <queue>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>

namespace packer_engine {

// ------------------------------------------------------------------------------------- errors
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
static const bool kTrace = [] {
  const char* v = std::getenv("PACKER_ENGINE_TRACE");
  return v != nullptr && v[0] == '1';
}();
// Each line starts with milliseconds on a monotonic clock (a batch's stages line up across threads).
static double trace_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define TRACE(...)                                                 \
  do {                                                             \
    if (kTrace) {                                                  \
      std::fprintf(stderr, "packer engine: %.3f ", trace_ms());    \
      std::fprintf(stderr, __VA_ARGS__);                           \
      std::fputc('\n', stderr);                                    \
    }                                                              \
  } while (0)

// An integer setting from the environment (read when an engine is made, so one process can compare two).
static long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0') ? x : fallback;
}

// Per-image status codes (mirrored in readers/gpu/engine.py).
enum Status : int32_t {
  kOk = 0,
  kBadHeader = 1,      // the header does not parse: damaged or not a JPEG
  kUnsupported = 2,    // parses, but nvJPEG cannot decode it to RGB (e.g. CMYK, 12-bit): CPU fallback
  kDecodeFailed = 3,   // nvJPEG failed on the data: CPU fallback decides whether it is damaged
};

// ------------------------------------------------------------------------------- thread pool
class Pool {
 public:
  explicit Pool(int n, std::function<void(int)> init) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i, init] { init(i); loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (abandoned_) {
        t.detach();  // one may be stuck in a CUDA or nvJPEG call: never wait for it
      } else {
        t.join();
      }
    }
  }
  void abandon() { abandoned_ = true; }
  int size() const { return int(threads_.size()); }
  // Runs fn(worker, i) for i in [0, n) on the pool; returns when all are done. The first
  // exception is rethrown here (the others are dropped after the batch finishes).
  void parallel_for(int n, const std::function<void(int, int)>& fn) {
    if (n == 0) return;
    std::atomic<int> next{0};
    std::atomic<int> done_workers{0};
    std::exception_ptr first;
    std::mutex err_m;
    int workers = std::min(n, size());
    std::unique_lock<std::mutex> lk(m_);
    for (int w = 0; w < workers; ++w) {
      tasks_.push([&, n](int worker) {
        for (int i = next++; i < n; i = next++) {
          try {
            fn(worker, i);
          } catch (...) {
            std::lock_guard<std::mutex> g(err_m);
            if (!first) first = std::current_exception();
          }
        }
        {
          std::lock_guard<std::mutex> g(m_);
          ++done_workers;
        }
        done_cv_.notify_all();
      });
    }
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return done_workers.load() == workers; });
    lk.unlock();
    if (first) std::rethrow_exception(first);
  }

 private:
  void loop(int worker) {
    for (;;) {
      std::function<void(int)> task;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
        if (stop_ && tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop();
      }
      task(worker);
    }
  }
  std::vector<std::thread> threads_;
  std::queue<std::function<void(int)>> tasks_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  bool abandoned_ = false;
};

// -------------------------------------------------------------------------- per-thread state
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

// One lane of the hardware JPEG engine: a decoder state, a CUDA stream and a host thread per batch.
// Several lanes split a batch's hardware share and run at once: for small images one hardware
// batch call at a time is bound by its host thread (about one core), for large ones the engine
// itself is the limit and one lane is faster (see kHwLanes).
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

// Where each engine thread is (for the watchdog's message): a stuck batch names the call it is in.
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

// Sets a thread's Where for the scope of one call.
struct At {
  std::atomic<int>& slot;
  At(std::atomic<int>& s, int w) : slot(s) { slot.store(w, std::memory_order_relaxed); }
  ~At() { slot.store(kIdle, std::memory_order_relaxed); }
};

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

class Engine {
 public:
  // hardware_share < 0: balanced from each batch's timings (starting at kAutoStart).
  Engine(int64_t device, int64_t threads, double hardware_share, int64_t gpu_huffman_pixels)
      : device_(int(device)),
        auto_share_(hardware_share < 0.0),
        hw_share_(hardware_share < 0.0 ? kAutoStart : hardware_share),
        gpu_huffman_px_(gpu_huffman_pixels) {
    TORCH_CHECK(threads >= 1 && threads <= 256, "packer engine: threads must be 1..256, got ", threads);
    TORCH_CHECK(hardware_share == -1.0 || (hardware_share >= 0.0 && hardware_share <= 1.0),
                "packer engine: hardware_share must be in [0, 1] or -1 (balanced), got ", hardware_share);
    c10::cuda::CUDAGuard guard(device_);
    NVJ(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &handle_));
    NVJ(nvjpegDecoderCreate(handle_, NVJPEG_BACKEND_HYBRID, &decoders_[0]));
    NVJ(nvjpegDecoderCreate(handle_, NVJPEG_BACKEND_GPU_HYBRID, &decoders_[1]));
    // The hardware JPEG engine (A100, H100, ...); absent on most other GPUs.
    if (hw_share_ > 0.0) {
      nvjpegStatus_t s = nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &hw_handle_);
      if (s == NVJPEG_STATUS_SUCCESS) {
        // PACKER_ENGINE_HW_LANES: host threads (and decoder states) the hardware share is split over.
        const long lanes = std::max(1L, std::min(8L, env_long("PACKER_ENGINE_HW_LANES", kHwLanes)));
        // PACKER_ENGINE_HW_PREALLOCATE=0: no nvjpegDecodeBatchedPreAllocate (it turns on nvJPEG's
        // memory pool for the hardware backend instead of allocating and freeing per batch).
        const bool preallocate = env_long("PACKER_ENGINE_HW_PREALLOCATE", 1) != 0;
        for (long l = 0; l < lanes; ++l) {
          auto lane = std::make_unique<HwLane>();
          NVJ(nvjpegJpegStateCreate(hw_handle_, &lane->state));
          if (preallocate) {
            nvjpegStatus_t p = nvjpegDecodeBatchedPreAllocate(hw_handle_, lane->state, 1, 1, 1, NVJPEG_CSS_444,
                                                              NVJPEG_OUTPUT_RGBI);
            if (p != NVJPEG_STATUS_SUCCESS)
              hw_notes_ = std::string("nvjpegDecodeBatchedPreAllocate: nvJPEG ") + nvjpeg_status_name(p);
          }
          CUDA_OK(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
          CUDA_OK(cudaEventCreateWithFlags(&lane->done, cudaEventDisableTiming));
          hw_.push_back(std::move(lane));
        }
        hardware_ = true;
      } else {
        hw_handle_ = nullptr;
        hw_reason_ = std::string("no hardware JPEG engine: nvJPEG ") + nvjpeg_status_name(s);
      }
    } else {
      hw_reason_ = "hardware_share is 0";
    }
    // Blocking sync: the threads that wait on it sleep instead of spinning.
    CUDA_OK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming | cudaEventBlockingSync));
    workers_.resize(size_t(threads));
    where_.reset(new std::atomic<int>[size_t(threads)]);
    for (int64_t i = 0; i < threads; ++i) {
      where_[size_t(i)] = kIdle;
      workers_[size_t(i)].where = &where_[size_t(i)];
    }
    std::mutex init_m;
    std::exception_ptr init_error;
    std::atomic<int> inited{0};
    // The pool's threads run at a nice increment of kPoolNice (PACKER_ENGINE_POOL_NICE): on a
    // crowded host the hardware lanes' host threads, the engine's own thread and the caller's
    // (the training loop's kernel launches) win a contended core over the Huffman work.
    const long pool_nice = env_long("PACKER_ENGINE_POOL_NICE", kPoolNice);
    pool_ = std::make_unique<Pool>(int(threads), [this, &init_m, &init_error, &inited, pool_nice](int w) {
      try {
        if (pool_nice != 0) {
          const auto tid = id_t(syscall(SYS_gettid));
          errno = 0;
          const int now = getpriority(PRIO_PROCESS, tid);
          if (errno == 0) setpriority(PRIO_PROCESS, tid, now + int(pool_nice));
        }
        init_worker(workers_[size_t(w)]);
      } catch (...) {
        std::lock_guard<std::mutex> g(init_m);
        if (!init_error) init_error = std::current_exception();
      }
      ++inited;
    });
    while (inited.load() < threads) std::this_thread::yield();
    if (init_error) std::rethrow_exception(init_error);
    orchestrator_ = std::thread([this] { orchestrate(); });
  }

  ~Engine() {
    {
      pybind11::gil_scoped_release nogil;  // queued batches finish first (they may need no GIL, but be safe)
      {
        std::lock_guard<std::mutex> g(jobs_m_);
        stop_ = true;
      }
      jobs_cv_.notify_all();
      if (stuck_) {  // a thread is stuck in CUDA/nvJPEG: leak the engine rather than hang the process
        orchestrator_.detach();
        pool_->abandon();
        pool_.release();
        return;
      }
      if (orchestrator_.joinable()) orchestrator_.join();
    }
    pool_.reset();  // joins the threads before their state goes
    c10::cuda::CUDAGuard guard(device_);
    for (auto& p : pending_)
      if (p.first) {
        cudaEventSynchronize(p.first);
        cudaEventDestroy(p.first);
      }
    pending_.clear();
    tickets_.clear();
    for (auto& w : workers_) {
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
    for (auto& lane : hw_) {
      if (lane->stream) cudaStreamSynchronize(lane->stream);
      for (auto p : lane->params) nvjpegDecodeParamsDestroy(p);
      if (lane->state) nvjpegJpegStateDestroy(lane->state);
      if (lane->stream) cudaStreamDestroy(lane->stream);
      if (lane->done) cudaEventDestroy(lane->done);
    }
    hw_.clear();
    if (hw_handle_) nvjpegDestroy(hw_handle_);
    if (ready_) cudaEventDestroy(ready_);
    for (auto d : decoders_)
      if (d) nvjpegDecoderDestroy(d);
    if (handle_) nvjpegDestroy(handle_);
  }

  bool hardware() const { return hardware_; }
  // Host milliseconds of the last call: header pass, the threads' part, the hardware batch call
  // (its host side), the whole call.
  std::vector<double> last_timings() const { return std::vector<double>(timings_, timings_ + 4); }
  double hardware_share() const { return hardware_ ? hw_share_ : 0.0; }
  std::string hardware_reason() const { return hw_reason_; }
  int64_t hardware_lanes() const { return int64_t(hw_.size()); }
  // nvjpegGetHardwareDecoderInfo: (engines, cores per engine); (0, 0) without the hardware engine.
  std::vector<int64_t> hardware_decoder_info() const {
    unsigned int engines = 0, cores = 0;
    if (hw_handle_ != nullptr && nvjpegGetHardwareDecoderInfo(hw_handle_, &engines, &cores) != NVJPEG_STATUS_SUCCESS)
      engines = cores = 0;
    return {int64_t(engines), int64_t(cores)};
  }
  std::string hardware_notes() const { return hw_notes_; }
  // Hardware batches that failed as a whole (their images were decoded on the threads), and why
  // the last one did.
  int64_t hardware_failures() const {
    std::lock_guard<std::mutex> g(hw_error_m_);
    return hw_failures_;
  }
  std::string hardware_error() const {
    std::lock_guard<std::mutex> g(hw_error_m_);
    return hw_last_error_;
  }
  int64_t threads() const { return pool_->size(); }

  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<std::string>, int64_t>;

  // buffers: host uint8 tensors; parts: int64 [B, 3] (buffer, offset, length). Queues the batch
  // for the engine's own thread and returns a ticket for result(): the next batch's host work
  // (and the caller's Python) overlaps this one. The output is ready on the caller's current
  // stream once result() has returned.
  int64_t submit(const std::vector<at::Tensor>& buffers, const at::Tensor& parts,
                 const c10::optional<at::Tensor>& regions) {
    TORCH_CHECK(parts.dim() == 2 && parts.size(1) == 3 && parts.scalar_type() == at::kLong && parts.device().is_cpu(),
                "packer engine: parts must be a CPU int64 tensor [B, 3], got ", parts.sizes(), " ",
                parts.scalar_type());
    for (size_t b = 0; b < buffers.size(); ++b) {
      const auto& t = buffers[b];
      TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.is_contiguous(),
                  "packer engine: buffer ", b, " must be a contiguous CPU uint8 tensor");
    }
    auto job = std::make_shared<Job>();
    job->stream = c10::cuda::getCurrentCUDAStream(device_);
    const int64_t B = parts.size(0);
    auto p = parts.contiguous();
    const int64_t* pp = p.data_ptr<int64_t>();
    job->images.resize(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      int64_t b = pp[3 * i], off = pp[3 * i + 1], len = pp[3 * i + 2];
      TORCH_CHECK(b >= 0 && b < int64_t(buffers.size()), "packer engine: image ", i, " names buffer ", b,
                  " of ", buffers.size());
      TORCH_CHECK(off >= 0 && len >= 0 && off + len <= buffers[size_t(b)].numel(), "packer engine: image ", i,
                  " (offset ", off, ", length ", len, ") lies outside its buffer of ", buffers[size_t(b)].numel(),
                  " bytes");
      job->images[size_t(i)].data = buffers[size_t(b)].data_ptr<uint8_t>() + off;
      job->images[size_t(i)].length = size_t(len);
    }
    if (regions.has_value() && regions->defined()) {
      const at::Tensor& r = *regions;
      TORCH_CHECK(r.dim() == 2 && r.size(0) == B && r.size(1) == 4 && r.scalar_type() == at::kLong &&
                      r.device().is_cpu(),
                  "packer engine: regions must be a CPU int64 tensor [", B, ", 4] (top, left, height, width), got ",
                  r.sizes(), " ", r.scalar_type());
      auto rc = r.contiguous();
      const int64_t* rp = rc.data_ptr<int64_t>();
      for (int64_t i = 0; i < B; ++i) {
        Image& im = job->images[size_t(i)];
        im.roi_top = rp[4 * i];
        im.roi_left = rp[4 * i + 1];
        im.roi_h = rp[4 * i + 2];
        im.roi_w = rp[4 * i + 3];
      }
    }
    job->buffers = buffers;
    release_finished_inputs();  // with the GIL: a buffer's last reference may be a Python object
    std::lock_guard<std::mutex> g(jobs_m_);
    TORCH_CHECK(!stop_, "packer engine: closed");
    TORCH_CHECK(!stuck_, "packer engine: stopped after a batch that did not finish (see the first error)");
    const int64_t ticket = next_ticket_++;
    tickets_[ticket] = job;
    queue_.push_back(job);
    jobs_cv_.notify_all();
    return ticket;
  }

  Result result(int64_t ticket) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> g(jobs_m_);
      auto it = tickets_.find(ticket);
      TORCH_CHECK(it != tickets_.end(), "packer engine: no batch with ticket ", ticket, " (already collected?)");
      job = it->second;
      tickets_.erase(it);
    }
    bool finished = true;
    {
      pybind11::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(jobs_m_);
      finished = jobs_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s_), [&] { return job->done; });
      if (!finished) stuck_ = true;
    }
    // A batch that never finishes is an error naming where it stopped, never a hang: the engine is
    // then unusable (its threads may be stuck in a CUDA or nvJPEG call and are abandoned).
    TORCH_CHECK(finished, "packer engine: a batch did not finish within ", timeout_s_,
                " s (PACKER_ENGINE_TIMEOUT_S); it stopped in: ", stage_name(stage_.load()),
                hw_busy() ? " (a hardware JPEG engine's thread had not finished)" : "", "; ",
                where_report(), ". Use another decoder (decoder=\"nvjpeg\") and please report this.");
    if (job->error) std::rethrow_exception(job->error);
    std::vector<std::string> messages(job->images.size());
    for (size_t i = 0; i < job->images.size(); ++i) messages[i] = job->images[i].message;
    return {job->data, job->index, job->sizes, job->status, messages, job->by_hw};
  }

 private:
  struct Job {
    std::vector<Image> images;
    std::vector<at::Tensor> buffers;  // moved to pending_ once the work is queued on the GPU
    c10::cuda::CUDAStream stream = c10::cuda::getDefaultCUDAStream();
    at::Tensor data, index, sizes, status;
    int64_t by_hw = 0;
    cudaEvent_t inputs_done = nullptr;
    bool headers_read = false;  // the header pass ran while the batch before was decoding
    std::exception_ptr error;
    bool done = false;
  };

  void orchestrate() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(jobs_m_);
        jobs_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopped, nothing left
        job = queue_.front();
        queue_.pop_front();
        TRACE("batch taken (%zu more queued)", queue_.size());
      }
      try {
        run_job(*job);
      } catch (...) {
        job->error = std::current_exception();
      }
      std::lock_guard<std::mutex> g(jobs_m_);
      if (job->inputs_done) {
        pending_.emplace_back(job->inputs_done, std::move(job->buffers));
      } else {  // failed before queuing GPU work: nothing reads the inputs any more
        pending_.emplace_back(nullptr, std::move(job->buffers));
      }
      job->buffers = std::vector<at::Tensor>();
      job->done = true;
      jobs_cv_.notify_all();
    }
  }

  void run_job(Job& job) {
    std::vector<Image>& images = job.images;
    const int64_t B = int64_t(images.size());
    c10::cuda::CUDAGuard guard(device_);
    c10::cuda::CUDAStreamGuard on_callers_stream(job.stream);  // the output's allocation and index copy
    cudaStream_t caller = job.stream.stream();
    using clock = std::chrono::steady_clock;
    auto ms_since = [](clock::time_point t) { return std::chrono::duration<double, std::milli>(clock::now() - t).count(); };
    auto t_call = clock::now();
    TRACE("batch of %lld: headers%s", (long long)B, job.headers_read ? " (read already)" : "");
    stage_ = 1;
    if (!job.headers_read) read_headers(job);
    timings_[0] = ms_since(t_call);
    TRACE("headers done");
    int64_t total = plan(images);
    TRACE("allocating %lld bytes", (long long)total);
    stage_ = 2;
    at::Tensor data = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device_));
    TRACE("allocated");
    // The output's memory may have been used on the caller's stream until now: every stream
    // that writes it starts after that.
    CUDA_OK(cudaEventRecord(ready_, caller));
    uint8_t* out = data.data_ptr<uint8_t>();
    for (auto& w : workers_) w.used = false;
    std::vector<int> hybrid, hw;
    double px = 0.0, hw_px = 0.0, capable_px = 0.0;
    int capable_n = 0;
    for (int64_t i = 0; i < B; ++i) {
      const Image& im = images[size_t(i)];
      if (im.status != kOk) continue;
      (im.to_hardware ? hw : hybrid).push_back(int(i));
      const double n = double(im.height * im.width);
      px += n;
      if (im.to_hardware) hw_px += n;
      if (im.hardware_ok) {
        capable_px += n;
        ++capable_n;
      }
    }
    // The hardware batch (its call blocks until the engine is done) runs on threads of its own,
    // one per lane, while the pool decodes the rest. (Letting it run on beside the next batch's
    // decode, two batches in flight, was tried: loader runs on an H100 stopped within their first
    // batches, the hardware thread in nvjpegDecodeBatched and every pool thread in
    // nvjpegDecodeJpegTransferToDevice; the cause was not found. docs/benchmarks/vs_dali.md. Only
    // the next batch's header pass, which queues no GPU work, runs beside it: see below.)
    // The hardware share, split over the lanes (contiguous parts of about equal pixels).
    const std::vector<std::vector<int>> parts = split_hardware(images, hw);
    std::vector<std::thread> lane_threads;
    // Joined on every way out (an error on the pool's side must not leave a joinable thread).
    struct JoinAll {
      std::vector<std::thread>& threads;
      ~JoinAll() {
        for (auto& t : threads)
          if (t.joinable()) t.join();
      }
    } join_all{lane_threads};
    for (size_t l = 0; l < parts.size(); ++l) {
      HwLane* lane = hw_[l].get();
      lane->error = nullptr;
      lane->decoded = 0;
      lane->ms = 0.0;
      lane_threads.emplace_back([this, lane, l, &parts, &images, out, &ms_since] {
        try {
          auto t_hw = clock::now();
          TRACE("hardware batch of %zu (lane %zu)", parts[l].size(), l);
          lane->decoded = decode_hardware(*lane, images, parts[l], out);
          lane->ms = ms_since(t_hw);
          TRACE("hardware batch done (lane %zu)", l);
        } catch (...) {
          lane->error = std::current_exception();
        }
      });
    }
    auto t0 = clock::now();
    TRACE("threads: %zu images", hybrid.size());
    stage_ = 3;
    pool_->parallel_for(int(hybrid.size()), [&](int w, int k) {
      decode_hybrid(workers_[size_t(w)], images[size_t(hybrid[size_t(k)])], out);
    });
    timings_[1] = ms_since(t0);
    TRACE("threads done");
    // While the hardware call runs on, the pool reads the next queued batch's headers (the
    // hardware engine then waits only for its own batch's start, not for a header pass).
    if (!parts.empty() && preread_) {
      std::shared_ptr<Job> next;
      {
        std::lock_guard<std::mutex> g(jobs_m_);
        if (!queue_.empty()) next = queue_.front();
      }
      if (next && !next->headers_read) {
        try {
          read_headers(*next);
        } catch (...) {  // read again in its own turn (read_header starts each image afresh)
          next->headers_read = false;
        }
        TRACE("next batch's headers read");
      }
    }
    TRACE("joining the hardware batch");
    stage_ = 4;
    int64_t by_hw = 0;
    timings_[2] = 0.0;
    std::exception_ptr hw_error;
    for (size_t l = 0; l < parts.size(); ++l) {
      HwLane& lane = *hw_[l];
      if (lane_threads[l].joinable()) lane_threads[l].join();
      if (lane.error && !hw_error) hw_error = lane.error;
      by_hw += lane.decoded;
      timings_[2] = std::max(timings_[2], lane.ms);
    }
    if (hw_error) std::rethrow_exception(hw_error);
    // Images the hardware batch could not take (it failed as a whole): the hybrid path, one by one.
    std::vector<int> retry;
    for (int i : hw)
      if (images[size_t(i)].status == kDecodeFailed && images[size_t(i)].to_hardware) {
        images[size_t(i)].status = kOk;
        images[size_t(i)].to_hardware = false;
        images[size_t(i)].message.clear();
        retry.push_back(i);
      }
    pool_->parallel_for(int(retry.size()), [&](int w, int k) {
      decode_hybrid(workers_[size_t(w)], images[size_t(retry[size_t(k)])], out);
    });
    for (auto& w : workers_)
      if (w.used) {
        CUDA_OK(cudaEventRecord(w.done, w.cuda));
        CUDA_OK(cudaStreamWaitEvent(caller, w.done, 0));
      }
    for (size_t l = 0; l < parts.size(); ++l) {
      CUDA_OK(cudaEventRecord(hw_[l]->done, hw_[l]->stream));
      CUDA_OK(cudaStreamWaitEvent(caller, hw_[l]->done, 0));
    }
    TRACE("index");
    stage_ = 5;
    at::Tensor index_cpu = at::empty({B, 3}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    job.sizes = at::empty({B, 2}, at::TensorOptions().dtype(at::kLong));
    job.status = at::empty({B}, at::TensorOptions().dtype(at::kInt));
    int64_t* ix = index_cpu.data_ptr<int64_t>();
    int64_t* sz = job.sizes.data_ptr<int64_t>();
    int32_t* st = job.status.data_ptr<int32_t>();
    for (int64_t i = 0; i < B; ++i) {
      const Image& im = images[size_t(i)];
      ix[3 * i] = im.offset;
      ix[3 * i + 1] = sz[2 * i] = im.out_h;
      ix[3 * i + 2] = sz[2 * i + 1] = im.out_w;
      st[i] = im.status;
    }
    job.index = index_cpu.to(data.device(), /*non_blocking=*/true);
    // The GPU may still read the input bytes (the transfers are asynchronous): they stay
    // referenced until the caller's stream has passed this point.
    CUDA_OK(cudaEventCreateWithFlags(&job.inputs_done, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(job.inputs_done, caller));
    job.data = data;
    job.by_hw = by_hw;
    timings_[3] = ms_since(t_call);
    TRACE("batch done in %.2f ms", timings_[3]);
    stage_ = 0;
    if (auto_share_ && hardware_ && px > 0.0) {
      const bool large = capable_n > 0 && capable_px / capable_n > kLaneMaxPixels;
      if (balance_ == kBalanceEqual || (balance_ == kBalanceBySize && large))
        equalize(timings_[1], px - hw_px, timings_[2], hw_px, capable_px);
      else
        observe(timings_[3], px);
    }
  }

  bool hw_busy() const {
    for (auto& lane : hw_)
      if (lane->where.load() != kIdle) return true;
    return false;
  }

  // "threads: 3 in nvjpegDecodeJpegHost, 9 idle; hardware threads: nvjpegDecodeBatched, idle"
  std::string where_report() const {
    int count[kWhereCount] = {0};
    for (int i = 0; i < pool_->size(); ++i) {
      int w = where_[size_t(i)].load();
      ++count[(w >= 0 && w < kWhereCount) ? w : kIdle];
    }
    std::ostringstream m;
    m << "threads:";
    const char* sep = " ";
    for (int w = kWhereCount - 1; w >= 0; --w)
      if (count[w]) {
        m << sep << count[w] << (w == kIdle ? " " : " in ") << where_name(w);
        sep = ", ";
      }
    m << "; hardware threads: ";
    if (hw_.empty()) m << "none";
    for (size_t l = 0; l < hw_.size(); ++l) m << (l == 0 ? "" : ", ") << where_name(hw_[l]->where.load());
    return m.str();
  }

  // PACKER_ENGINE_TEST_STALL_S: the threads' decode sleeps this long per image (tests the watchdog).
  static void stall_for_test() {
    static const double stall_s = [] {
      const char* v = std::getenv("PACKER_ENGINE_TEST_STALL_S");
      return v ? std::atof(v) : 0.0;
    }();
    if (stall_s > 0.0) std::this_thread::sleep_for(std::chrono::duration<double>(stall_s));
  }

  static constexpr double kAutoStart = 0.8;
  // Hardware lanes: two, used for images of at most kLaneMaxPixels on average; larger ones go to
  // one lane. Measured on an H100 (docs/benchmarks/vs_dali.md, session 7): two lanes took the
  // hardware engine alone from ~22k to ~31k ~500 px images/s (one call at a time is bound by its
  // host thread there), but at 1080p, where the engine itself is the limit (~5.8k/s), two lanes
  // slowed it to ~5.0k and three to ~4.5k.
  static constexpr long kHwLanes = 2;
  static constexpr double kLaneMaxPixels = 1 << 20;

  // The pool threads' nice increment (see the constructor; H100, 1080p, the engine alone with
  // 16 threads: 7.0-7.4k img/s at 5 or 10 against 6.4-6.9k at 0).
  static constexpr long kPoolNice = 5;

  // Balanced share, two rules (docs/benchmarks/vs_dali.md, session 15):
  // - images over kLaneMaxPixels (one hardware lane): equal times. There the hardware engine
  //   itself is the limit and its rate hardly moves with the threads' load, so the batch, which
  //   waits for the longer of the threads' part and the hardware call, is shortest where the two
  //   take equally long. After each batch: the share that would have made them equal at the rates
  //   this batch showed (pixels per ms on each side), and a step of kGain toward it, at most
  //   kMaxStep. A side that decoded nothing gives no rate: the share steps kMaxStep toward it.
  //   (H100, 1080p, the engine alone, 12 threads: 7.0-7.7k img/s against the climb's 6.7-7.1k.)
  // - smaller images: the hill climb on the whole call's time per pixel (below). There the lanes'
  //   host threads are the limit and slow down as the threads take more, so equal times sit past
  //   the best share (H100, ~500 px, the engine alone, 12 threads: 17.2-17.7k img/s against the
  //   climb's 19.4-20.4k).
  // PACKER_ENGINE_BALANCE=equal or =climb uses one rule for every batch (for measuring).
  static constexpr double kGain = 0.5;
  static constexpr double kMaxStep = 0.05;
  void equalize(double threads_ms, double threads_px, double hw_ms, double hw_px, double capable_px) {
    if (capable_px <= 0.0) return;  // nothing the share decides
    double target;
    if (hw_px <= 0.0 || hw_ms <= 0.0) {
      target = hw_share_ + kMaxStep;
    } else if (threads_px <= 0.0 || threads_ms <= 0.0) {
      target = hw_share_ - kMaxStep;
    } else {
      const double r_hw = hw_px / hw_ms, r_threads = threads_px / threads_ms;
      // hardware pixels x with x / r_hw == (all pixels - x) / r_threads, as a share of the capable ones
      target = r_hw * (threads_px + hw_px) / (r_hw + r_threads) / capable_px;
    }
    const double step = std::max(-kMaxStep, std::min(kMaxStep, kGain * (target - hw_share_)));
    hw_share_ = std::min(1.0, std::max(0.0, hw_share_ + step));
  }

  // The hill climb: one step of kStep per window of kWindow batches, turning back when a step made
  // the call's time per pixel worse (contention between the threads and the hardware included).
  static constexpr double kStep = 0.05;
  static constexpr int kWindow = 4;
  void observe(double call_ms, double px) {
    win_ms_ += call_ms;
    win_px_ += px;
    if (++win_n_ < kWindow) return;
    const double cost = win_ms_ / win_px_;
    win_ms_ = win_px_ = 0.0;
    win_n_ = 0;
    if (last_cost_ > 0.0 && cost > last_cost_) direction_ = -direction_;
    last_cost_ = cost;
    hw_share_ = std::min(1.0, std::max(0.0, hw_share_ + direction_ * kStep));
  }

  // Drops the inputs of batches the GPU has finished reading. Called with the GIL held.
  void release_finished_inputs() {
    std::deque<std::pair<cudaEvent_t, std::vector<at::Tensor>>> done;
    {
      std::lock_guard<std::mutex> g(jobs_m_);
      while (!pending_.empty() &&
             (pending_.front().first == nullptr || cudaEventQuery(pending_.front().first) != cudaErrorNotReady)) {
        done.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    for (auto& d : done)
      if (d.first) cudaEventDestroy(d.first);
  }

  void init_worker(Worker& w) {
    c10::cuda::CUDAGuard guard(device_);
    for (int k = 0; k < 2; ++k) NVJ(nvjpegJpegStreamCreate(handle_, &w.stream[k]));
    NVJ(nvjpegJpegStreamCreate(handle_, &w.header));
    for (int k = 0; k < 2; ++k) {
      NVJ(nvjpegDecoderStateCreate(handle_, decoders_[k], &w.state[k]));
      NVJ(nvjpegBufferPinnedCreate(handle_, nullptr, &w.pinned[k]));
      CUDA_OK(cudaEventCreateWithFlags(&w.pinned_free[k], pinned_event_flags()));
    }
    NVJ(nvjpegBufferDeviceCreate(handle_, nullptr, &w.device_buf));
    for (int k = 0; k < 2; ++k) NVJ(nvjpegStateAttachDeviceBuffer(w.state[k], w.device_buf));
    NVJ(nvjpegDecodeParamsCreate(handle_, &w.params));
    NVJ(nvjpegDecodeParamsSetOutputFormat(w.params, NVJPEG_OUTPUT_RGBI));
    NVJ(nvjpegDecodeParamsSetROI(w.params, 0, 0, -1, -1));
    NVJ(nvjpegDecodeParamsSetAllowCMYK(w.params, 1));
    CUDA_OK(cudaStreamCreateWithFlags(&w.cuda, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&w.done, cudaEventDisableTiming));
  }

  // The header pass over a batch, on the pool.
  void read_headers(Job& job) {
    pool_->parallel_for(int(job.images.size()), [&](int w, int i) {
      At at(where_[size_t(w)], kParseHeader);
      read_header(workers_[size_t(w)], job.images[size_t(i)]);
    });
    job.headers_read = true;
  }

  void read_header(Worker& w, Image& im) {
    im.status = kOk;
    im.message.clear();
    im.hardware_ok = im.to_hardware = false;
    nvjpegStatus_t s = nvjpegJpegStreamParseHeader(handle_, im.data, im.length, w.header);
    if (s != NVJPEG_STATUS_SUCCESS) {
      im.status = kBadHeader;
      im.message = std::string("header does not parse (nvJPEG ") + nvjpeg_status_name(s) + ")";
      return;
    }
    unsigned int width = 0, height = 0, comps = 0, precision = 8;
    nvjpegJpegStreamGetFrameDimensions(w.header, &width, &height);
    nvjpegJpegStreamGetComponentsNum(w.header, &comps);
    nvjpegJpegStreamGetSamplePrecision(w.header, &precision);
    nvjpegChromaSubsampling_t css = NVJPEG_CSS_UNKNOWN;
    nvjpegJpegStreamGetChromaSubsampling(w.header, &css);
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
    // Grayscale goes to the threads: the hardware engine's RGBI output of a one-component JPEG
    // is wrong (measured on an H200 with nvJPEG 13: mean error 47 levels against libjpeg-turbo).
    if (hardware_ && comps == 3) {
      int unsupported = 1;
      nvjpegStatus_t s2;
      if (im.roi) {  // the engine's support for a window
        set_params(w.params, im);
        s2 = nvjpegDecodeBatchedSupportedEx(hw_handle_, w.header, w.params, &unsupported);
      } else {
        s2 = nvjpegDecodeBatchedSupported(hw_handle_, w.header, &unsupported);
      }
      im.hardware_ok = s2 == NVJPEG_STATUS_SUCCESS && unsupported == 0;
    }
  }

  // The size decoded: the window asked for, clipped to the image, or the whole image.
  static void set_window(Image& im) {
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

  // Decode parameters for one image: RGB interleaved, its window or the whole image.
  static void set_params(nvjpegDecodeParams_t params, const Image& im) {
    NVJ(nvjpegDecodeParamsSetOutputFormat(params, NVJPEG_OUTPUT_RGBI));
    if (im.roi) {
      NVJ(nvjpegDecodeParamsSetROI(params, int(im.roi_left), int(im.roi_top), int(im.out_w), int(im.out_h)));
    } else {
      NVJ(nvjpegDecodeParamsSetROI(params, 0, 0, -1, -1));
    }
  }

  // The pool threads' waits for their pinned slots sleep (blocking sync) rather than spin: with
  // 12-16 engine threads on a 16-core host, spinning waits could take cores from the Huffman stage
  // and the loader's Python (measured on an H100: no difference either way within the noise).
  // PACKER_ENGINE_SPIN_WAITS=1 restores spinning (for measuring the two).
  static unsigned pinned_event_flags() {
    static const bool spin = [] {
      const char* v = std::getenv("PACKER_ENGINE_SPIN_WAITS");
      return v != nullptr && v[0] == '1';
    }();
    return spin ? cudaEventDisableTiming : (cudaEventDisableTiming | cudaEventBlockingSync);
  }

  // Offsets in the output; which engine-capable images go to the hardware (a share by pixels, the
  // largest first: the hybrid path pays per pixel on the CPU, the engine much less).
  int64_t plan(std::vector<Image>& images) {
    int64_t total = 0, capable_px = 0;
    std::vector<int> capable;
    for (size_t i = 0; i < images.size(); ++i) {
      Image& im = images[i];
      if (im.status == kBadHeader) continue;
      im.offset = total;
      total += im.out_h * im.out_w * 3;
      if (im.status == kOk && im.hardware_ok) {
        capable.push_back(int(i));
        capable_px += im.height * im.width;
      }
    }
    if (!hardware_ || capable.empty() || hw_share_ <= 0.0) return total;
    double budget = hw_share_ * double(capable_px);
    double taken = 0.0;
    for (int i : capable) {  // in batch order: the engine batches any mix of sizes
      if (taken >= budget) break;
      images[size_t(i)].to_hardware = true;
      taken += double(images[size_t(i)].height * images[size_t(i)].width);
    }
    return total;
  }

  // The hardware images in parts for the lanes: contiguous runs of about equal pixels, at least
  // kMinLaneImages images each (fewer lanes for a small share), one lane for large images.
  static constexpr size_t kMinLaneImages = 16;
  std::vector<std::vector<int>> split_hardware(const std::vector<Image>& images, const std::vector<int>& hw) const {
    std::vector<std::vector<int>> parts;
    if (hw.empty()) return parts;
    double total = 0.0;
    for (int i : hw) total += double(images[size_t(i)].height * images[size_t(i)].width);
    const size_t lanes = total / double(hw.size()) > kLaneMaxPixels
                             ? 1
                             : std::max<size_t>(1, std::min(hw_.size(), hw.size() / kMinLaneImages));
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

  int64_t decode_hardware(HwLane& lane, std::vector<Image>& images, const std::vector<int>& which, uint8_t* out) {
    // A new thread: make the device's context current on it before nvJPEG allocates (CUDAGuard
    // skips cudaSetDevice when the index already matches; nvJPEG's hardware backend then fails
    // with "allocator failure" on a thread with no current context).
    CUDA_OK(cudaSetDevice(device_));
    c10::cuda::CUDAGuard guard(device_);
    {
      At at(lane.where, kWaitOutput);
      const auto t_wait = std::chrono::steady_clock::now();
      wait_for_output();
      TRACE("hardware lane: output memory free after %.2f ms",
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_wait).count());
    }
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
      NVJ(nvjpegDecodeParamsCreate(hw_handle_, &p));
      lane.params.push_back(p);
    }
    if (windows)
      for (int k = 0; k < n; ++k) set_params(lane.params[size_t(k)], images[size_t(which[size_t(k)])]);
    nvjpegStatus_t s;
    const char* call = "nvjpegDecodeBatchedInitialize";
    {
      At at(lane.where, kHwInitialize);
      s = nvjpegDecodeBatchedInitialize(hw_handle_, lane.state, n, 1, NVJPEG_OUTPUT_RGBI);
    }
    TRACE("hardware lane: initialized for %d images", n);
    if (s == NVJPEG_STATUS_SUCCESS) {
      At at(lane.where, kHwDecode);
      call = windows ? "nvjpegDecodeBatchedEx" : "nvjpegDecodeBatched";
      s = windows ? nvjpegDecodeBatchedEx(hw_handle_, lane.state, datas.data(), lengths.data(), dst.data(),
                                          lane.params.data(), lane.stream)
                  : nvjpegDecodeBatched(hw_handle_, lane.state, datas.data(), lengths.data(), dst.data(), lane.stream);
    }

    if (s != NVJPEG_STATUS_SUCCESS) {  // the whole batch goes to the hybrid path
      {
        std::lock_guard<std::mutex> g(hw_error_m_);
        ++hw_failures_;
        hw_last_error_ = std::string(call) + " (hardware backend, " + std::to_string(n) + " images): nvJPEG " +
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

  // The batch's output may be memory the caller's stream used until this batch was queued (the
  // caching allocator hands it out on that stream). Every thread that writes it first waits on the
  // host for the caller's stream to pass that point (the ready_ event), instead of making its
  // stream wait on the GPU: the hardware engine's batch call blocks its thread inside nvJPEG, and a
  // GPU-side wait of the engine's streams on the caller's stream deadlocked a training run in the
  // CUDA driver (ResNet-50 on an H100 and an H200: the GPU idle, a kernel launch spinning on a
  // full queue, the training thread's launch waiting for the driver's lock). On the host nothing
  // can wait on work that waits on it. Cheap: the caller's stream is the loader's decode stream,
  // which holds only the previous batch's tail.
  void wait_for_output() { CUDA_OK(cudaEventSynchronize(ready_)); }

  void decode_hybrid(Worker& w, Image& im, uint8_t* out) {
    c10::cuda::CUDAGuard guard(device_);
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
      s = nvjpegJpegStreamParse(handle_, im.data, im.length, 0, 0, jstream);
    }
    if (s != NVJPEG_STATUS_SUCCESS) {
      im.status = kDecodeFailed;
      im.message = std::string("parse: nvJPEG ") + nvjpeg_status_name(s);
      return;
    }
    set_params(w.params, im);
    // GPU Huffman for large images, where that decoder takes the stream (not progressive ones).
    int k = im.height * im.width > gpu_huffman_px_ ? 1 : 0;
    if (k == 1) {
      int unsupported = 1;
      if (nvjpegDecoderJpegSupported(decoders_[1], jstream, w.params, &unsupported) != NVJPEG_STATUS_SUCCESS ||
          unsupported != 0)
        k = 0;
    }
    nvjpegJpegState_t state = w.state[k];
    nvjpegImage_t dst;
    std::memset(&dst, 0, sizeof(dst));
    dst.channel[0] = out + im.offset;
    dst.pitch[0] = size_t(im.out_w * 3);
    s = nvjpegStateAttachPinnedBuffer(state, w.pinned[slot]);
    if (s == NVJPEG_STATUS_SUCCESS) {
      At at(*w.where, kDecodeHost);
      s = nvjpegDecodeJpegHost(handle_, decoders_[k], state, w.params, jstream);
      stall_for_test();
    }
    if (s == NVJPEG_STATUS_SUCCESS && !w.used) {
      At at(*w.where, kWaitOutput);
      wait_for_output();
      w.used = true;
    }
    if (s == NVJPEG_STATUS_SUCCESS) {
      At at(*w.where, kTransfer);
      s = nvjpegDecodeJpegTransferToDevice(handle_, decoders_[k], state, jstream, w.cuda);
    }
    if (s == NVJPEG_STATUS_SUCCESS) {
      CUDA_OK(cudaEventRecord(w.pinned_free[slot], w.cuda));
      w.pinned_used[slot] = true;
      At at(*w.where, kDecodeDevice);
      s = nvjpegDecodeJpegDevice(handle_, decoders_[k], state, &dst, w.cuda);
    }
    if (s != NVJPEG_STATUS_SUCCESS) {
      im.status = kDecodeFailed;
      im.message = std::string("decode: nvJPEG ") + nvjpeg_status_name(s);
    }
  }

  int device_;
  bool auto_share_;
  // PACKER_ENGINE_BALANCE (see equalize); PACKER_ENGINE_PREREAD=0: no header pass for the next
  // batch during this one's hardware call (both for measuring).
  enum Balance { kBalanceBySize, kBalanceEqual, kBalanceClimb };
  Balance balance_ = [] {
    const char* v = std::getenv("PACKER_ENGINE_BALANCE");
    const std::string b = v != nullptr ? v : "";
    return b == "equal" ? kBalanceEqual : b == "climb" ? kBalanceClimb : kBalanceBySize;
  }();
  bool preread_ = env_long("PACKER_ENGINE_PREREAD", 1) != 0;
  double hw_share_;
  double timings_[4] = {0.0, 0.0, 0.0, 0.0};
  double win_ms_ = 0.0, win_px_ = 0.0, last_cost_ = 0.0;
  int win_n_ = 0;
  double direction_ = 1.0;
  int64_t gpu_huffman_px_;
  nvjpegHandle_t handle_ = nullptr;
  nvjpegJpegDecoder_t decoders_[2] = {nullptr, nullptr};
  bool hardware_ = false;
  std::string hw_reason_;
  nvjpegHandle_t hw_handle_ = nullptr;
  std::vector<std::unique_ptr<HwLane>> hw_;  // the hardware engine's lanes
  std::string hw_notes_;                     // a pre-allocation nvJPEG refused
  cudaEvent_t ready_ = nullptr;
  std::vector<Worker> workers_;
  std::unique_ptr<Pool> pool_;
  // Batches between submit() and result(), and the engine's own thread that runs them in order.
  std::mutex jobs_m_;
  std::condition_variable jobs_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<int64_t, std::shared_ptr<Job>> tickets_;
  int64_t next_ticket_ = 0;
  bool stop_ = false;
  bool stuck_ = false;  // a batch outlived timeout_s_ (see result())
  std::thread orchestrator_;
  double timeout_s_ = [] {
    const char* v = std::getenv("PACKER_ENGINE_TIMEOUT_S");
    double t = v ? std::atof(v) : 0.0;
    return t > 0.0 ? t : 120.0;
  }();
  std::atomic<int> stage_{0};
  std::unique_ptr<std::atomic<int>[]> where_;  // per pool thread
  mutable std::mutex hw_error_m_;
  int64_t hw_failures_ = 0;
  std::string hw_last_error_;
  std::deque<std::pair<cudaEvent_t, std::vector<at::Tensor>>> pending_;
};

int64_t nvjpeg_version() {
  int major = 0, minor = 0, patch = 0;
  nvjpegGetProperty(MAJOR_VERSION, &major);
  nvjpegGetProperty(MINOR_VERSION, &minor);
  nvjpegGetProperty(PATCH_LEVEL, &patch);
  return int64_t(major) * 10000 + minor * 100 + patch;
}

}  // namespace packer_engine

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using packer_engine::Engine;
  m.doc() = "packer's native nvJPEG engine (see gpu_ops/csrc/engine/engine.cpp)";
  m.def("nvjpeg_version", &packer_engine::nvjpeg_version, "nvJPEG's version as major*10000+minor*100+patch");
  pybind11::class_<Engine>(m, "Engine")
      .def(pybind11::init<int64_t, int64_t, double, int64_t>(), pybind11::arg("device"), pybind11::arg("threads"),
           pybind11::arg("hardware_share"), pybind11::arg("gpu_huffman_pixels"))
      .def("submit", &Engine::submit, pybind11::arg("buffers"), pybind11::arg("parts"),
           pybind11::arg("regions") = pybind11::none())
      .def("result", &Engine::result, pybind11::arg("ticket"))
      .def_property_readonly("hardware", &Engine::hardware)
      .def_property_readonly("hardware_reason", &Engine::hardware_reason)
      .def_property_readonly("hardware_share", &Engine::hardware_share)
      .def_property_readonly("hardware_lanes", &Engine::hardware_lanes)
      .def_property_readonly("hardware_notes", &Engine::hardware_notes)
      .def_property_readonly("hardware_decoder_info", &Engine::hardware_decoder_info)
      .def_property_readonly("hardware_failures", &Engine::hardware_failures)
      .def_property_readonly("hardware_error", &Engine::hardware_error)
      .def_property_readonly("last_timings", &Engine::last_timings)
      .def_property_readonly("threads", &Engine::threads);
}
