// See pool.h.
#include "pool.h"

#include <algorithm>
#include <atomic>
#include <exception>

namespace packer_engine {

Pool::Pool(int n, std::function<void(int)> init) {
  for (int i = 0; i < n; ++i) threads_.emplace_back([this, i, init] { init(i); loop(i); });
}

Pool::~Pool() {
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

void Pool::parallel_for(int n, const std::function<void(int, int)>& fn, int max_workers) {
  if (n == 0) return;
  std::atomic<int> next{0};
  std::atomic<int> done_workers{0};
  std::exception_ptr first;
  std::mutex err_m;
  int workers = std::min(n, size());
  if (max_workers > 0) workers = std::min(workers, max_workers);
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

void Pool::loop(int worker) {
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

}  // namespace packer_engine
