// A small fixed-size worker pool shared by the CPU kernels (no OpenMP: PyTorch already brings its
// own runtime, and two of them oversubscribe the cores).
//
// Two ways to use it:
//   * ds::parallel_for(n, grain, fn) on the process-wide pool: splits [0, n) into long
//     contiguous slices (about 8 per thread, none under `grain`) that the threads, the caller
//     among them, take in order from a shared counter; blocks until all are done. Long slices
//     keep each thread streaming through its own memory, as bandwidth-bound kernels want; taking
//     them dynamically means a thread that starts late (waking up, or on a core another process
//     holds) delays the call by a slice, not by a whole per-thread range.
//   * a private ds::ThreadPool(n) with submit(task) -> std::future<void>, for long-lived
//     asynchronous work (e.g. file I/O) that must not block the kernel pool.
//
// The process-wide pool is sized by ds::set_num_threads(n) (Python passes torch.get_num_threads());
// resizing is cheap when the size is unchanged. parallel_for called from inside a pool worker runs
// inline, so nested use cannot deadlock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ds {

class ThreadPool {
 public:
  // num_workers background threads (0 is allowed: everything then runs on the caller).
  explicit ThreadPool(int num_workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_workers() const { return static_cast<int>(workers_.size()); }

  // Queue a task for a worker; the future reports completion and rethrows its exception.
  std::future<void> submit(std::function<void()> task);

  // Run fn(begin, end) over [0, n) split into contiguous slices whose boundaries are multiples of
  // `align` (so SIMD blocks never straddle threads), on at most (num_workers + 1) threads; no
  // slice is shorter than `grain` elements except the last. Blocks until every slice is done;
  // the first exception thrown is rethrown here (slices not yet started are then skipped).
  void parallel_for(int64_t n, int64_t grain, int64_t align,
                    const std::function<void(int64_t, int64_t)>& fn);

  // True on a thread owned by any ThreadPool.
  static bool in_worker();

 private:
  void worker_loop();

  std::vector<std::thread> workers_;
  std::deque<std::packaged_task<void()>> queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// Process-wide kernel pool: total threads including the caller (>= 1).
void set_num_threads(int n);
int get_num_threads();

// parallel_for on the process-wide pool. Concurrent callers are serialised.
void parallel_for(int64_t n, int64_t grain, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ds
