#include "ds/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <new>
#include <utility>

namespace ds {
namespace {
thread_local bool t_in_worker = false;
}  // namespace

ThreadPool::ThreadPool(int num_workers) {
  num_workers = std::max(0, num_workers);
  workers_.reserve(static_cast<size_t>(num_workers));
  for (int i = 0; i < num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

bool ThreadPool::in_worker() { return t_in_worker; }

void ThreadPool::worker_loop() {
  t_in_worker = true;
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      // Drain the queue before stopping so no submitted future is left broken.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

std::future<void> ThreadPool::submit(std::function<void()> task) {
  std::packaged_task<void()> pt(std::move(task));
  std::future<void> fut = pt.get_future();
  if (workers_.empty()) {
    pt();  // no workers: run on the caller rather than never
    return fut;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(pt));
  }
  cv_.notify_one();
  return fut;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, int64_t align,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  align = std::max<int64_t>(align, 1);
  int64_t parts = std::min<int64_t>(num_workers() + 1, (n + grain - 1) / grain);
  if (parts <= 1 || in_worker()) {
    fn(0, n);
    return;
  }
  // Threads take contiguous slices from a shared counter instead of one fixed range each: a
  // thread that starts late (a worker waking up, a core busy with another process) then costs
  // only its share of the slices, not a whole range the others wait for. Slices stay long
  // (about kSlicesPerThread per thread, never under `grain`), so each one streams like a range.
  constexpr int64_t kSlicesPerThread = 8;
  int64_t slice = (n + parts * kSlicesPerThread - 1) / (parts * kSlicesPerThread);
  slice = std::max(slice, grain);
  slice = (slice + align - 1) / align * align;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  auto drain = [&] {
    for (;;) {
      const int64_t begin = next.fetch_add(slice, std::memory_order_relaxed);
      if (begin >= n || failed.load(std::memory_order_relaxed)) return;
      try {
        fn(begin, std::min(n, begin + slice));
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        throw;
      }
    }
  };
  std::vector<std::future<void>> futs;
  futs.reserve(static_cast<size_t>(parts - 1));
  for (int64_t i = 1; i < parts; ++i) futs.push_back(submit(drain));
  std::exception_ptr first;
  try {
    drain();
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& f : futs) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

namespace {
std::mutex g_pool_mu;  // serialises resizing and concurrent parallel_for callers
std::unique_ptr<ThreadPool> g_pool;
int g_num_threads = 1;

// A forked child (DataLoader workers, multiprocessing "fork") inherits the pool object but none of
// its threads: waiting on it would hang. The child drops it (leaked: its threads cannot be joined)
// and starts single-threaded; the next set_num_threads builds a fresh pool.
void reset_in_child() {
  (void)g_pool.release();
  g_num_threads = 1;
  new (&g_pool_mu) std::mutex();
}

const bool g_atfork_registered = [] {
  pthread_atfork(nullptr, nullptr, &reset_in_child);
  return true;
}();
}  // namespace

void set_num_threads(int n) {
  n = std::max(1, n);
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (n == g_num_threads && (n == 1 || g_pool)) return;
  g_pool.reset();
  if (n > 1) g_pool = std::make_unique<ThreadPool>(n - 1);
  g_num_threads = n;
}

int get_num_threads() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  return g_num_threads;
}

void parallel_for(int64_t n, int64_t grain, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (ThreadPool::in_worker()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) {
    if (n > 0) fn(0, n);
    return;
  }
  g_pool->parallel_for(n, grain, align, fn);
}

}  // namespace ds
