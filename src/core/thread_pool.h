// A fixed pool of worker threads for data-parallel loops (matmuls, quantization).
// parallel_for splits [0, n) into contiguous chunks; the calling thread takes part.
// Tasks must not throw: an exception in a task is caught and rethrown on the caller.
//
// A decode step runs a few hundred small loops (one per matmul, ~10-100 us each), so waking
// sleeping workers through a condition variable for every loop costs more than the loop on
// many cores. Workers therefore spin for a short while (kSpinNs) after their last chunk,
// watching for the next loop, and only then sleep; chunks are claimed with one atomic
// compare-and-swap on a counter that carries the loop's generation, so a worker still
// finishing one loop can never claim a chunk of the next one with stale arguments.
#pragma once

#include <atomic>
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
  // n_threads <= 0: hardware concurrency; more than kMaxThreads is invalid_argument. A thread
  // the system cannot create (a thread or memory limit) is an `unavailable` Error, after the
  // threads already started were stopped and joined.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end) over chunks of [0, n) of at least min_chunk items; blocks until done.
  void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  // Sized by set_global_threads, else SLUICE_THREADS (the switches' registry: an integer from 0
  // to kMaxThreads, 0 every core; anything else is an invalid_argument Error naming it).
  static ThreadPool& global();
  static void set_global_threads(int n);  // before first use of global()

  // The most threads a pool takes (the CLI's --threads and SLUICE_THREADS alike).
  static constexpr int kMaxThreads = 1024;

  // How long an idle worker watches for the next loop before it sleeps. Long enough to span
  // the gap between two matmuls of a decode step, short enough that an idle pool goes quiet
  // at once.
  static constexpr int64_t kSpinNs = 200'000;

 private:
  void worker_loop();
  // Claims and runs chunks of generation `gen` until none is left; true if it ran any.
  bool run_chunks(uint32_t gen);
  void record_error();

  std::vector<std::thread> workers_;

  // The loop being run; written by the caller before it publishes the generation in claim_,
  // read by a worker only after it claimed one of the loop's chunks.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  // High 32 bits: a loop's generation; low 32 bits: its chunk count. A worker compares its
  // claim against the count of the same generation only: while the caller writes the next
  // loop's arguments, a worker still holding the last loop's claim word must see that loop's
  // count (and give up), never the next loop's.
  std::atomic<uint64_t> bounds_{0};
  // High 32 bits: generation of the current loop; low 32 bits: the next chunk to claim.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> chunks_done_{0};

  // Sleeping workers wait here for a new generation or stop.
  std::mutex sleep_mutex_;
  std::condition_variable sleep_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};

  std::mutex error_mutex_;
  std::exception_ptr error_;
  std::mutex call_mutex_;  // one parallel_for at a time
  uint32_t generation_ = 0;  // guarded by call_mutex_
};

}  // namespace sluice
