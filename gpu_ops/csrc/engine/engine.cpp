// The native decoder's life (see engine.h): opening nvJPEG and the threads, closing them (or
// leaking them where a batch is stuck), taking batches in (submit) and handing them out (result).
#include "engine.h"

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace packer_engine {
namespace {

// PACKER_ENGINE_TIMEOUT_S: how long result() waits for a batch (default 120 s).
double timeout_from_env() {
  const char* v = std::getenv("PACKER_ENGINE_TIMEOUT_S");
  double t = v ? std::atof(v) : 0.0;
  return t > 0.0 ? t : 120.0;
}

// The pool's threads run at a nice increment of kPoolNice (PACKER_ENGINE_POOL_NICE): on a crowded
// host the hardware lanes' host threads, the native decoder's own thread and the caller's (the
// training loop's kernel launches) win a contended core over the Huffman work. (H100, 1080p, the
// native decoder alone with 16 threads: 7.0-7.4k img/s at 5 or 10 against 6.4-6.9k at 0.)
constexpr long kPoolNice = 5;

void lower_priority(long nice) {
  if (nice == 0) return;
  const auto tid = id_t(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno == 0) setpriority(PRIO_PROCESS, tid, now + int(nice));
}

// The CPUs this process may run on (its affinity mask: a container's or taskset's share), else
// the machine's.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? int(n) : 1;
}

// regions: int64 [B, 4] (top, left, height, width), the window of each image.
void read_regions(const at::Tensor& r, std::vector<Image>& images) {
  const int64_t B = int64_t(images.size());
  TORCH_CHECK(r.dim() == 2 && r.size(0) == B && r.size(1) == 4 && r.scalar_type() == at::kLong && r.device().is_cpu(),
              "packer engine: regions must be a CPU int64 tensor [", B, ", 4] (top, left, height, width), got ",
              r.sizes(), " ", r.scalar_type());
  auto rc = r.contiguous();
  const int64_t* rp = rc.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    Image& im = images[size_t(i)];
    im.roi_top = rp[4 * i];
    im.roi_left = rp[4 * i + 1];
    im.roi_h = rp[4 * i + 2];
    im.roi_w = rp[4 * i + 3];
  }
}

}  // namespace

Engine::Engine(int64_t device, int64_t threads, double hardware_share, int64_t gpu_huffman_pixels)
    : device_(int(device)), balancer_(hardware_share), timeout_s_(timeout_from_env()) {
  TORCH_CHECK(threads >= 1 && threads <= 256, "packer engine: threads must be 1..256, got ", threads);
  TORCH_CHECK(hardware_share == -1.0 || (hardware_share >= 0.0 && hardware_share <= 1.0),
              "packer engine: hardware_share must be in [0, 1] or -1 (balanced), got ", hardware_share);
  host_.device = device_;
  host_.gpu_huffman_px = gpu_huffman_pixels;
  cpus_ = usable_cpus();
  c10::cuda::CUDAGuard guard(device_);
  open_nvjpeg();
  start_pool(threads);
  orchestrator_ = std::thread([this] { orchestrate(); });
}

// nvJPEG's handle and the threads' two decoders, and the hardware JPEG decoder (where there is one
// and the share is not 0).
void Engine::open_nvjpeg() {
  NVJ(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &host_.handle));
  NVJ(nvjpegDecoderCreate(host_.handle, NVJPEG_BACKEND_HYBRID, &host_.decoders[0]));
  NVJ(nvjpegDecoderCreate(host_.handle, NVJPEG_BACKEND_GPU_HYBRID, &host_.decoders[1]));
  hardware_ = std::make_unique<HardwareLanes>(balancer_.share() > 0.0);
}

// The pool, each thread making its nvJPEG state first; the first failure is rethrown here.
void Engine::start_pool(int64_t threads) {
  workers_.resize(size_t(threads));
  where_.reset(new std::atomic<int>[size_t(threads)]);
  for (int64_t i = 0; i < threads; ++i) {
    where_[size_t(i)] = kIdle;
    workers_[size_t(i)].where = &where_[size_t(i)];
  }
  std::mutex init_m;
  std::exception_ptr init_error;
  std::atomic<int> inited{0};
  const long pool_nice = env_long("PACKER_ENGINE_POOL_NICE", kPoolNice);
  pool_ = std::make_unique<Pool>(int(threads), [this, &init_m, &init_error, &inited, pool_nice](int w) {
    try {
      lower_priority(pool_nice);
      init_worker(host_, workers_[size_t(w)]);
    } catch (...) {
      std::lock_guard<std::mutex> g(init_m);
      if (!init_error) init_error = std::current_exception();
    }
    ++inited;
  });
  while (inited.load() < threads) std::this_thread::yield();
  if (init_error) std::rethrow_exception(init_error);
}

Engine::~Engine() {
  {
    pybind11::gil_scoped_release nogil;  // queued batches finish first (they may need no GIL, but be safe)
    {
      std::lock_guard<std::mutex> g(jobs_m_);
      stop_ = true;
    }
    jobs_cv_.notify_all();
    if (stuck_) {  // a thread is stuck in CUDA/nvJPEG: leak the native decoder rather than hang the process
      orchestrator_.detach();
      pool_->abandon();
      pool_.release();
      hardware_.release();
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
  for (auto& w : workers_) destroy_worker(w);
  hardware_.reset();
  for (auto d : host_.decoders)
    if (d) nvjpegDecoderDestroy(d);
  if (host_.handle) nvjpegDestroy(host_.handle);
}

// The batch's images (views into `buffers`) and windows, checked.
std::shared_ptr<Engine::Job> Engine::make_job(const std::vector<at::Tensor>& buffers, const at::Tensor& parts,
                                              const c10::optional<at::Tensor>& regions) const {
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
  if (regions.has_value() && regions->defined()) read_regions(*regions, job->images);
  job->buffers = buffers;
  return job;
}

int64_t Engine::submit(const std::vector<at::Tensor>& buffers, const at::Tensor& parts,
                       const c10::optional<at::Tensor>& regions) {
  auto job = make_job(buffers, parts, regions);
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

Engine::Result Engine::result(int64_t ticket) {
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
  // A batch that never finishes is an error naming where it stopped, never a hang: the native
  // decoder is then unusable (its threads may be stuck in a CUDA or nvJPEG call and are abandoned).
  TORCH_CHECK(finished, "packer engine: a batch did not finish within ", timeout_s_,
              " s (PACKER_ENGINE_TIMEOUT_S); it stopped in: ", stage_name(stage_.load()),
              hardware_->busy() ? " (a hardware JPEG engine's thread had not finished)" : "", "; ",
              where_report(), ". Use another decoder (decoder=\"nvjpeg\") and please report this.");
  if (job->error) std::rethrow_exception(job->error);
  std::vector<std::string> messages(job->images.size());
  for (size_t i = 0; i < job->images.size(); ++i) messages[i] = job->images[i].message;
  return {job->data, job->index, job->sizes, job->status, messages, job->by_hw};
}

// "threads: 3 in nvjpegDecodeJpegHost, 9 idle; hardware threads: nvjpegDecodeBatched, idle"
std::string Engine::where_report() const {
  const std::vector<int64_t> count = where_counts();  // the pool's threads first
  std::ostringstream m;
  m << "threads:";
  const char* sep = " ";
  for (int w = kWhereCount - 1; w >= 0; --w)
    if (count[w]) {
      m << sep << count[w] << (w == kIdle ? " " : " in ") << where_name(w);
      sep = ", ";
    }
  m << "; hardware threads: " << hardware_->where_report();
  return m.str();
}

std::vector<int64_t> Engine::where_counts() const {
  std::vector<int64_t> counts(2 * kWhereCount, 0);
  for (int i = 0; i < pool_->size(); ++i) {
    const int w = where_[size_t(i)].load(std::memory_order_relaxed);
    ++counts[size_t((w >= 0 && w < kWhereCount) ? w : kIdle)];
  }
  for (const int w : hardware_->wheres()) ++counts[size_t(kWhereCount + ((w >= 0 && w < kWhereCount) ? w : kIdle))];
  return counts;
}

int64_t Engine::threads_beside_hardware(int64_t lanes) const {
  const int64_t all = pool_->size();
  if (beside_hardware_ >= 0) return beside_hardware_ == 0 ? all : std::min<int64_t>(all, beside_hardware_);
  return std::max<int64_t>(1, std::min<int64_t>(all, int64_t(cpus_) - lanes - 2));
}

// Drops the inputs of batches the GPU has finished reading. Called with the GIL held.
void Engine::release_finished_inputs() {
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

int64_t nvjpeg_version() {
  int major = 0, minor = 0, patch = 0;
  nvjpegGetProperty(MAJOR_VERSION, &major);
  nvjpegGetProperty(MINOR_VERSION, &minor);
  nvjpegGetProperty(PATCH_LEVEL, &patch);
  return int64_t(major) * 10000 + minor * 100 + patch;
}

}  // namespace packer_engine
