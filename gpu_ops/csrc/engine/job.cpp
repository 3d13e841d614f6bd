// One batch on the native decoder's own thread (see engine.h): the header pass, the plan, the
// hardware share on the lanes beside the threads' decode, the retry of a failed hardware batch,
// the stream joins and the index.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <chrono>

#include "engine.h"
#include "header.h"

namespace packer_engine {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

void Engine::orchestrate() {
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
    if (job->ready) {  // every writer has waited for it (run_job joined them on every way out)
      cudaEventDestroy(job->ready);
      job->ready = nullptr;
      host_.ready = nullptr;
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

void Engine::run_job(Job& job) {
  std::vector<Image>& images = job.images;
  const int64_t B = int64_t(images.size());
  c10::cuda::CUDAGuard guard(device_);
  c10::cuda::CUDAStreamGuard on_callers_stream(job.stream);  // the output's allocation and index copy
  cudaStream_t caller = job.stream.stream();
  auto t_call = Clock::now();
  TRACE("batch of %lld: headers%s", (long long)B, job.headers_read ? " (read already)" : "");
  stage_ = 1;
  if (!job.headers_read) read_headers(job);
  timings_[0] = ms_since(t_call);
  TRACE("headers done");
  stage_ = 2;
  if (!job.allocated) allocate_output(job);
  balancer_.plan(job.images, hardware());
  host_.ready = job.ready;  // the threads wait for it (hybrid.cpp), the lanes are handed it below
  uint8_t* out = job.data.data_ptr<uint8_t>();
  for (auto& w : workers_) w.used = false;
  const Routes routes = route(images);
  // The hardware batch (its call blocks until the hardware decoder is done) runs on threads of
  // its own, one per lane, while the pool decodes the rest. (Letting it run on beside the next
  // batch's decode, two batches in flight, was tried: loader runs on an H100 stopped within their
  // first batches, the hardware thread in nvjpegDecodeBatched and every pool thread in
  // nvjpegDecodeJpegTransferToDevice; the cause was not found. docs/benchmarks/vs_dali.md. Only
  // the next batch's header pass, which queues no GPU work, and its output's allocation run beside
  // it: see preread_next and prepare_next.)
  HardwareBatch lanes(*hardware_, device_, job.ready, images, hardware_->split(images, routes.hardware), out);
  auto t0 = Clock::now();
  TRACE("threads: %zu images", routes.threads.size());
  stage_ = 3;
  decode_on_threads(images, routes.threads, out,
                    lanes.lanes() > 0 ? int(threads_beside_hardware(int64_t(lanes.lanes()))) : 0);
  timings_[1] = ms_since(t0);
  TRACE("threads done");
  if (lanes.lanes() > 0 && preread_) {
    preread_next();
    if (prepare_next_) prepare_next();
  }
  TRACE("joining the hardware batch");
  stage_ = 4;
  const int64_t by_hw = lanes.finish(&timings_[2]);
  retry_on_threads(images, routes.hardware, out);
  join_threads_streams(caller);
  lanes.join_streams(caller);
  TRACE("index");
  stage_ = 5;
  write_index(job, job.data);
  // The GPU may still read the input bytes (the transfers are asynchronous): they stay
  // referenced until the caller's stream has passed this point.
  CUDA_OK(cudaEventCreateWithFlags(&job.inputs_done, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(job.inputs_done, caller));
  job.by_hw = by_hw;
  timings_[3] = ms_since(t_call);
  TRACE("batch done in %.2f ms", timings_[3]);
  stage_ = 0;
  if (hardware()) balancer_.after_batch(routes.px, timings_[1], timings_[2], timings_[3]);
}

// The batch's output: the offsets (the same whatever the plan), the memory on the batch's stream
// (the caller's), and the event every writer of the output waits for first: the memory may have
// been in use on that stream until now (common.h, wait_for_output).
void Engine::allocate_output(Job& job) {
  c10::cuda::CUDAStreamGuard on_its_stream(job.stream);
  const int64_t total = Balancer::layout(job.images);
  TRACE("allocating %lld bytes", (long long)total);
  job.data = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device_));
  if (job.ready == nullptr)
    CUDA_OK(cudaEventCreateWithFlags(&job.ready, cudaEventDisableTiming | cudaEventBlockingSync));
  CUDA_OK(cudaEventRecord(job.ready, job.stream.stream()));
  job.allocated = true;
  TRACE("allocated");
}

// While the hardware call runs on, the next queued batch's output (its headers read already). Its
// `ready` event then lies before this batch's joins on the caller's stream, so its writers do not
// wait for this batch's last GPU work (the hardware lane waited 3.5-4.7% of its time for it at
// 1080p on an H200, session 25). Its plan still waits for its turn (Balancer::plan).
void Engine::prepare_next() {
  std::shared_ptr<Job> next;
  {
    std::lock_guard<std::mutex> g(jobs_m_);
    if (!queue_.empty()) next = queue_.front();
  }
  if (!next || !next->headers_read || next->allocated) return;
  try {
    allocate_output(*next);
    ++allocated_ahead_;
  } catch (...) {  // allocated again in its own turn
    next->allocated = false;
    next->data = at::Tensor();
  }
  TRACE("next batch's output allocated");
}

// The header pass over a batch, on the pool.
void Engine::read_headers(Job& job) {
  pool_->parallel_for(int(job.images.size()), [&](int w, int i) {
    At at(where_[size_t(w)], kParseHeader);
    Worker& worker = workers_[size_t(w)];
    read_header(host_.handle, hardware_->handle(), worker.header, worker.params, job.images[size_t(i)]);
  });
  job.headers_read = true;
}

Engine::Routes Engine::route(const std::vector<Image>& images) const {
  Routes r;
  for (size_t i = 0; i < images.size(); ++i) {
    const Image& im = images[i];
    if (im.status != kOk) continue;
    (im.to_hardware ? r.hardware : r.threads).push_back(int(i));
    const double n = double(im.height * im.width);
    r.px.all += n;
    if (im.to_hardware) r.px.hw += n;
    if (im.hardware_ok) {
      r.px.capable += n;
      ++r.px.capable_n;
    }
  }
  return r;
}

void Engine::decode_on_threads(std::vector<Image>& images, const std::vector<int>& which, uint8_t* out,
                               int max_workers) {
  pool_->parallel_for(
      int(which.size()),
      [&](int w, int k) { decode_hybrid(host_, workers_[size_t(w)], images[size_t(which[size_t(k)])], out); },
      max_workers);
}

// While the hardware call runs on, the pool reads the next queued batch's headers (the hardware
// decoder then waits only for its own batch's start, not for a header pass).
void Engine::preread_next() {
  std::shared_ptr<Job> next;
  {
    std::lock_guard<std::mutex> g(jobs_m_);
    if (!queue_.empty()) next = queue_.front();
  }
  if (!next || next->headers_read) return;
  try {
    read_headers(*next);
  } catch (...) {  // read again in its own turn (read_header starts each image afresh)
    next->headers_read = false;
  }
  TRACE("next batch's headers read");
}

// Images the hardware batch could not take (it failed as a whole): the threads, one by one.
void Engine::retry_on_threads(std::vector<Image>& images, const std::vector<int>& hw, uint8_t* out) {
  std::vector<int> retry;
  for (int i : hw)
    if (images[size_t(i)].status == kDecodeFailed && images[size_t(i)].to_hardware) {
      images[size_t(i)].status = kOk;
      images[size_t(i)].to_hardware = false;
      images[size_t(i)].message.clear();
      retry.push_back(i);
    }
  decode_on_threads(images, retry, out);
}

// The caller's stream waits for every thread's stream that wrote to the output.
void Engine::join_threads_streams(cudaStream_t caller) {
  for (auto& w : workers_)
    if (w.used) {
      CUDA_OK(cudaEventRecord(w.done, w.cuda));
      CUDA_OK(cudaStreamWaitEvent(caller, w.done, 0));
    }
}

// The index (offset, height, width) on the GPU, the sizes and statuses on the host.
void Engine::write_index(Job& job, const at::Tensor& data) {
  const std::vector<Image>& images = job.images;
  const int64_t B = int64_t(images.size());
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
}

}  // namespace packer_engine
