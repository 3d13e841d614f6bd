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

// How many threads a parallel section may use for `tasks` independent tasks: `requested` when a
// caller asks for a count (> 0), else torch's thread count (torch.set_num_threads), 1 inside an
// ATen parallel region; never more than the tasks, never fewer than 1.
inline int64_t available_threads(int64_t tasks, int64_t requested = 0) {
  const int64_t max_threads =
      requested > 0 ? requested : (at::in_parallel_region() ? 1 : at::get_num_threads());
  return std::max<int64_t>(1, std::min<int64_t>(max_threads, tasks));
}

// Runs `work` on `threads` threads at once (the caller's is one of them) and joins them. Where the
// system refuses a thread, the ones started and the caller's run alone: `work` must share its
// tasks through a counter, not assume a thread count. `work` must not throw.
template <class F>
void run_on_threads(int64_t threads, const F& work) {
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(std::max<int64_t>(threads - 1, 0)));
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads (limits): the ones started and this one cover the work
    }
  }
  work();
  for (auto& t : pool) t.join();
}

// Calls f(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain` iterations,
// on as many threads as torch.get_num_threads() (or `requested`, when > 0) allows and the range
// has chunks for.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f, int64_t requested = 0) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  const int64_t threads = available_threads((n + grain - 1) / grain, requested);
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
  run_on_threads(threads, [&]() {
    try {
      for (int64_t s = next.fetch_add(chunk); s < end; s = next.fetch_add(chunk)) {
        f(s, std::min<int64_t>(end, s + chunk));
      }
    } catch (...) {  // nothing may escape a std::thread (std::terminate)
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(end);  // the others stop after their current chunk
    }
  });
  if (error) std::rethrow_exception(error);
}

// Splits the rows [begin, end) of a batch laid out as consecutive runs of `rows` rows per
// sample (a parallel_for chunk of B * rows) into per-sample runs: f(b, y_begin, y_end).
template <class F>
void for_each_sample_rows(int64_t begin, int64_t end, int64_t rows, const F& f) {
  for (int64_t row = begin; row < end;) {
    const int64_t b = row / rows, ya = row % rows;
    const int64_t yb = std::min<int64_t>(rows, ya + (end - row));
    f(b, ya, yb);
    row += yb - ya;
  }
}

}  // namespace gpu_ops
