// A fixed pool of worker threads for data-parallel loops (matmuls, quantization).
// parallel_for splits [0, n) into contiguous chunks; the calling thread takes part.
// Tasks must not throw: an exception in a task is caught and rethrown on the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sluice {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end) over chunks of [0, n) of at least min_chunk items; blocks until done.
  void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  static ThreadPool& global();           // sized by SLUICE_THREADS or the core count
  static void set_global_threads(int n);  // before first use of global()

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_ = 0;   // guarded by mutex_
  int64_t n_chunks_ = 0;
  int64_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex call_mutex_;  // one parallel_for at a time
};

}  // namespace sluice
