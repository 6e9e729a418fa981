// ThreadPool: workers wait on a generation counter; chunks are handed out under a mutex
// (the chunks are coarse, a few per thread, so the lock is not contended).
#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace sluice {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (job_ && next_chunk_ < n_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t begin = c * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
      lock.unlock();
      try {
        (*fn)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> g(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      lock.lock();
      if (++chunks_done_ == n_chunks_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t max_chunks = std::max<int64_t>(1, n / min_chunk);
  int64_t n_chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  if (workers_.empty() || n_chunks <= 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  int64_t chunk = (n + n_chunks - 1) / n_chunks;
  n_chunks = (n + chunk - 1) / chunk;
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_chunk_ = 0;
  n_chunks_ = n_chunks;
  chunks_done_ = 0;
  error_ = nullptr;
  ++generation_;
  cv_work_.notify_all();
  while (next_chunk_ < n_chunks_) {
    int64_t c = next_chunk_++;
    int64_t begin = c * chunk, end = std::min(n, begin + chunk);
    lock.unlock();
    try {
      fn(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> g(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
    ++chunks_done_;
  }
  cv_done_.wait(lock, [&] { return chunks_done_ == n_chunks_; });
  job_ = nullptr;
  std::exception_ptr err = error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

namespace {
int g_global_threads = 0;
}

void ThreadPool::set_global_threads(int n) { g_global_threads = n; }

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (g_global_threads > 0) return g_global_threads;
    if (const char* env = std::getenv("SLUICE_THREADS")) return std::atoi(env);
    return 0;
  }());
  return pool;
}

}  // namespace sluice
