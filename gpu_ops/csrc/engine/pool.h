// The native decoder's thread pool: a fixed set of threads, each with its own nvJPEG state (the
// engine's Worker, indexed by the thread's number), and one blocking parallel_for per stage.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace packer_engine {

class Pool {
 public:
  // Starts n threads; each runs init(its number) first (the engine makes its nvJPEG state there).
  Pool(int n, std::function<void(int)> init);
  // Joins the threads, or detaches them after abandon() (one may be stuck in a CUDA call).
  ~Pool();
  void abandon() { abandoned_ = true; }
  int size() const { return int(threads_.size()); }
  // Runs fn(worker, i) for i in [0, n) on the pool (on at most max_workers of its threads where
  // max_workers > 0); returns when all are done. The first exception is rethrown here (the others
  // are dropped after the batch finishes).
  void parallel_for(int n, const std::function<void(int, int)>& fn, int max_workers = 0);

 private:
  void loop(int worker);
  std::vector<std::thread> threads_;
  std::queue<std::function<void(int)>> tasks_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  bool abandoned_ = false;
};

}  // namespace packer_engine
