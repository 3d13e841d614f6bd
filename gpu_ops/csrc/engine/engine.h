// packer's native decoder: the host side of a GPU JPEG decode batch in C++, out of the GIL.
//
// One call decodes a batch of JPEG byte strings (views into the reader's pinned buffers) into one
// packed HWC uint8 buffer on the GPU (a gpu_ops RaggedBatch: data + (offset, height, width) rows):
//
//   1. header pass, on the thread pool (header.h): nvjpegJpegStreamParseHeader per image (size,
//      components, whether the hardware JPEG decoder takes it); the output is allocated once for
//      the batch;
//   2. the hardware share (balancer.h: a fraction of the capable images, by pixels) goes to the
//      hardware JPEG decoder: nvjpegDecodeBatched calls on threads of their own, one per lane
//      (hardware.h: two lanes for images of up to ~1 Mpx, one for larger), each with its decoder
//      state and stream;
//   3. every other image is decoded on the pool (pool.h) with nvJPEG's decoupled API (hybrid.h),
//      one decoder state, JPEG stream, two pinned buffers and one CUDA stream per thread;
//   4. the caller's stream waits on an event of every stream used (no host synchronisation).
//
// Batches are jobs (job.cpp): submit() queues one for the native decoder's own thread and returns
// a ticket; result() waits for it (with a watchdog: a batch that never finishes is an error naming
// where it stopped, never a hang).
//
// A batch may name a window per image (``regions``: top, left, height, width), the crop a train
// pipeline drew from the stored sizes before decoding: only that window is decoded and stored
// (nvjpegDecodeParamsSetROI on the threads, nvjpegDecodeBatchedEx with per-image parameters on the
// hardware decoder, where nvjpegDecodeBatchedSupportedEx accepts it). A window reaching outside
// the image (a stored size that does not match the header) is clipped to it; the index says the
// size decoded.
//
// Images nvJPEG rejects are reported per image (status + message) for the Python side to decode
// with libjpeg-turbo or to raise naming the record; nothing here is a JPEG decoder of its own.
//
// Files: common.h (errors, trace, Image, Where), pool.*, header.*, hybrid.* (the threads' decode),
// hardware.* (the hardware JPEG decoder's lanes), balancer.*, engine.cpp (the object's life,
// submit/result), job.cpp (one batch), module.cpp (the Python binding). Built by gpu_ops/engine.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Optional.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "balancer.h"
#include "common.h"
#include "hardware.h"
#include "hybrid.h"
#include "pool.h"

namespace packer_engine {

class Engine {
 public:
  // hardware_share < 0: balanced from each batch's timings (starting at Balancer::kAutoStart).
  Engine(int64_t device, int64_t threads, double hardware_share, int64_t gpu_huffman_pixels);
  ~Engine();

  bool hardware() const { return hardware_->available(); }
  // Host milliseconds of the last call: header pass, the threads' part, the hardware batch call
  // (its host side), the whole call.
  std::vector<double> last_timings() const { return std::vector<double>(timings_, timings_ + 4); }
  double hardware_share() const { return hardware() ? balancer_.share() : 0.0; }
  std::string hardware_reason() const { return hardware_->reason(); }
  int64_t hardware_lanes() const { return int64_t(hardware_->size()); }
  std::vector<int64_t> hardware_decoder_info() const { return hardware_->decoder_info(); }
  std::string hardware_notes() const { return hardware_->notes(); }
  int64_t hardware_failures() const { return hardware_->failures(); }
  std::string hardware_error() const { return hardware_->last_error(); }
  int64_t threads() const { return pool_->size(); }
  // How many pool threads, then how many hardware lanes' threads, are in each Where now (2 x
  // kWhereCount counts; a sampler reads where the time goes: scripts/bench_engine.py).
  std::vector<int64_t> where_counts() const;
  // Batches whose output was allocated during the batch before's hardware call (prepare_next).
  int64_t outputs_allocated_ahead() const { return allocated_ahead_.load(); }
  // How many of the threads decode while the hardware decoder's lanes run beside them (see
  // beside_hardware_ below).
  int64_t threads_beside_hardware(int64_t lanes) const;

  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<std::string>, int64_t>;

  // buffers: host uint8 tensors; parts: int64 [B, 3] (buffer, offset, length). Queues the batch
  // for the native decoder's own thread and returns a ticket for result(): the next batch's host
  // work (and the caller's Python) overlaps this one. The output is ready on the caller's current
  // stream once result() has returned.
  int64_t submit(const std::vector<at::Tensor>& buffers, const at::Tensor& parts,
                 const c10::optional<at::Tensor>& regions);
  Result result(int64_t ticket);

 private:
  // One batch between submit() and result().
  struct Job {
    std::vector<Image> images;
    std::vector<at::Tensor> buffers;  // moved to pending_ once the work is queued on the GPU
    c10::cuda::CUDAStream stream = c10::cuda::getDefaultCUDAStream();
    at::Tensor data, index, sizes, status;
    int64_t by_hw = 0;
    cudaEvent_t ready = nullptr;  // the output's memory is free on `stream` (allocate_output)
    bool allocated = false;       // allocate_output ran (maybe during the batch before's hardware call)
    cudaEvent_t inputs_done = nullptr;
    bool headers_read = false;  // the header pass ran while the batch before was decoding
    std::exception_ptr error;
    bool done = false;
  };
  // A batch's images by where they go, and their pixels.
  struct Routes {
    std::vector<int> threads, hardware;
    BatchPixels px;
  };

  // engine.cpp: the object's life and the watchdog's message.
  void open_nvjpeg();
  void start_pool(int64_t threads);
  std::shared_ptr<Job> make_job(const std::vector<at::Tensor>& buffers, const at::Tensor& parts,
                                const c10::optional<at::Tensor>& regions) const;
  std::string where_report() const;
  void release_finished_inputs();
  // job.cpp: one batch on the native decoder's own thread.
  void orchestrate();
  void run_job(Job& job);
  void read_headers(Job& job);
  Routes route(const std::vector<Image>& images) const;
  void decode_on_threads(std::vector<Image>& images, const std::vector<int>& which, uint8_t* out,
                         int max_workers = 0);
  void preread_next();
  void allocate_output(Job& job);
  void prepare_next();
  void retry_on_threads(std::vector<Image>& images, const std::vector<int>& hw, uint8_t* out);
  void join_threads_streams(cudaStream_t caller);
  void write_index(Job& job, const at::Tensor& data);

  int device_;
  Balancer balancer_;
  // PACKER_ENGINE_PREREAD=0: no header pass for the next batch during this one's hardware call
  // (for measuring).
  bool preread_ = env_long("PACKER_ENGINE_PREREAD", 1) != 0;
  // PACKER_ENGINE_PREPARE_NEXT=0: the next batch's output only in its own turn (for measuring).
  bool prepare_next_ = env_long("PACKER_ENGINE_PREPARE_NEXT", 1) != 0;
  // While the hardware lanes run, the pool decodes on at most (the CPUs this process may use) -
  // (lanes) - 2 threads: each lane's host thread, the native decoder's own thread and the caller's
  // need a core. (H200, 16 CPUs, full decode balanced, median of 3: 1080p 7,015 img/s on 12
  // threads, 6,304 on 16; ~500 px 35,470 and 32,383. The threads alone, without the lanes, still
  // rise to 16: 2,422 and 3,055 img/s at 1080p. docs/benchmarks/session19.md.)
  // PACKER_ENGINE_THREADS_BESIDE_HARDWARE=N fixes it (0: every thread, for measuring).
  int cpus_ = 0;
  long beside_hardware_ = env_long("PACKER_ENGINE_THREADS_BESIDE_HARDWARE", -1);
  double timings_[4] = {0.0, 0.0, 0.0, 0.0};
  HostDecoders host_;  // nvJPEG's handle and the threads' two decoders
  std::unique_ptr<HardwareLanes> hardware_;
  std::vector<Worker> workers_;
  std::unique_ptr<Pool> pool_;
  // Batches between submit() and result(), and the native decoder's own thread that runs them in order.
  std::mutex jobs_m_;
  std::condition_variable jobs_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<int64_t, std::shared_ptr<Job>> tickets_;
  int64_t next_ticket_ = 0;
  bool stop_ = false;
  bool stuck_ = false;  // a batch outlived timeout_s_ (see result())
  std::thread orchestrator_;
  double timeout_s_;
  std::atomic<int> stage_{0};
  std::atomic<int64_t> allocated_ahead_{0};
  std::unique_ptr<std::atomic<int>[]> where_;  // per pool thread
  std::deque<std::pair<cudaEvent_t, std::vector<at::Tensor>>> pending_;
};

int64_t nvjpeg_version();

}  // namespace packer_engine
