// ThreadPool: spin-then-sleep workers and generation-tagged chunk claiming (thread_pool.h).
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <system_error>

#include "core/error.h"
#include "core/switches.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLUICE_CPU_RELAX() _mm_pause()
#else
#define SLUICE_CPU_RELAX() std::this_thread::yield()
#endif

namespace sluice {
namespace {

constexpr uint64_t pack_claim(uint32_t gen, uint32_t next) { return (static_cast<uint64_t>(gen) << 32) | next; }
constexpr uint32_t claim_gen(uint64_t c) { return static_cast<uint32_t>(c >> 32); }
constexpr uint32_t claim_next(uint64_t c) { return static_cast<uint32_t>(c); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  SLUICE_CHECK(n_threads <= kMaxThreads, Status::invalid_argument, n_threads, " threads: at most ", kMaxThreads);
  try {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::system_error& e) {
    // The members die with the constructor: the workers already running wait on them, so they
    // are stopped and joined first (destroying a condition variable with waiters hangs).
    const size_t started = workers_.size();
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      stop_.store(true);
    }
    sleep_cv_.notify_all();
    for (auto& t : workers_) t.join();
    fail(Status::unavailable, "cannot start ", n_threads, " threads (", started + 1,
         " started; the system's thread or memory limit): ", e.what(), "; ask for fewer with --threads");
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true);
  }
  sleep_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::record_error() {
  std::lock_guard<std::mutex> g(error_mutex_);
  if (!error_) error_ = std::current_exception();
}

bool ThreadPool::run_chunks(uint32_t gen) {
  bool ran = false;
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (claim_gen(c) != gen) return ran;
    const uint32_t i = claim_next(c);
    // The chunk count of this very generation: once the caller moves on (every chunk of
    // `gen` claimed and done), bounds_ names another generation and the worker stops here.
    const uint64_t b = bounds_.load(std::memory_order_acquire);
    if (claim_gen(b) != gen || i >= claim_next(b)) return ran;
    if (!claim_.compare_exchange_weak(c, pack_claim(gen, i + 1), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;
    const int64_t begin = static_cast<int64_t>(i) * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
    try {
      (*job_)(begin, end);
    } catch (...) {
      record_error();
    }
    ran = true;
    chunks_done_.fetch_add(1, std::memory_order_acq_rel);
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;  // the last generation this worker looked at
  for (;;) {
    // Spin while loops keep coming; sleep after kSpinNs without one.
    int64_t idle_since = now_ns();
    for (;;) {
      if (stop_.load(std::memory_order_acquire)) return;
      const uint32_t gen = claim_gen(claim_.load(std::memory_order_acquire));
      if (gen != seen) {
        seen = gen;
        run_chunks(gen);
        idle_since = now_ns();
        continue;
      }
      SLUICE_CPU_RELAX();
      if (now_ns() - idle_since > kSpinNs) break;
    }
    std::unique_lock<std::mutex> lock(sleep_mutex_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    sleep_cv_.wait(lock, [&] {
      return stop_.load(std::memory_order_seq_cst) || claim_gen(claim_.load(std::memory_order_seq_cst)) != seen;
    });
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
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
  const int64_t chunk = (n + n_chunks - 1) / n_chunks;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  n_chunks = (n + chunk - 1) / chunk;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = ++generation_;
  bounds_.store(pack_claim(gen, static_cast<uint32_t>(n_chunks)), std::memory_order_release);
  // Publishes the fields above (release) and wakes sleepers; the seq_cst pair (this store, the
  // sleepers load) against (sleepers add, claim load) in worker_loop loses no wake-up.
  claim_.store(pack_claim(gen, 0), std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    sleep_cv_.notify_all();
  }
  run_chunks(gen);
  // The remaining chunks are running on workers: spin (a decode step's chunks take
  // microseconds), then yield the core for long chunks or an oversubscribed machine.
  const int64_t wait_from = now_ns();
  while (chunks_done_.load(std::memory_order_acquire) < n_chunks) {
    if (now_ns() - wait_from < kSpinNs) {
      SLUICE_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> g(error_mutex_);
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

namespace {
int g_global_threads = 0;
// SLUICE_THREADS takes what --threads takes: 0 (every core) to the pool's bound.
static_assert(switches::kSwitches[static_cast<int>(Switch::threads)].max == ThreadPool::kMaxThreads);
}

void ThreadPool::set_global_threads(int n) { g_global_threads = n; }

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (g_global_threads > 0) return g_global_threads;
    return static_cast<int>(switches::integer(Switch::threads));  // 0: every core
  }());
  return pool;
}

}  // namespace sluice
