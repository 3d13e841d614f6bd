// gpu_ops::parallel_for: at::parallel_for's contract on std::threads, for the CPU kernels.
//
// Why not at::parallel_for: it is a header template whose OpenMP body (`#pragma omp parallel`) is
// compiled into *this* extension, which is built without -fopenmp (a second OpenMP runtime beside
// the libgomp torch bundles is a known source of crashes and oversubscription), so the pragma was
// ignored and every "parallel" kernel ran on one thread. This starts up to
// torch.get_num_threads() - 1 threads per call (the caller works too), hands out chunks of the
// range through an atomic counter, joins them, and rethrows the first exception on the caller's
// thread (as at::parallel_for does). Small ranges run inline: a thread costs ~20-50 us to start.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace gpu_ops {

// Calls f(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain` iterations,
// on as many threads as torch.get_num_threads() allows and the range has chunks for.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t threads = std::min<int64_t>(max_threads, (n + grain - 1) / grain);
  if (threads <= 1) {
    f(begin, end);
    return;
  }
  // About 4 chunks per thread (rows differ in cost: a crop's padding, a warp's out-of-image rows),
  // never fewer iterations than `grain`.
  const int64_t chunk = std::max<int64_t>(grain, (n + 4 * threads - 1) / (4 * threads));
  std::atomic<int64_t> next{begin};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() {
    try {
      for (int64_t s = next.fetch_add(chunk); s < end; s = next.fetch_add(chunk)) {
        f(s, std::min<int64_t>(end, s + chunk));
      }
    } catch (...) {  // nothing may escape a std::thread (std::terminate)
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(end);  // the others stop after their current chunk
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads (limits): the ones started and this one cover the range
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace gpu_ops
