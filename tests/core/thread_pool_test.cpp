// ThreadPool: every index of every loop runs exactly once, across many back-to-back loops
// (workers spinning between them), after the workers went to sleep, with concurrent callers,
// and an exception in a task reaches the caller.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace sluice {
namespace {

// Runs a loop over n items that counts each index; returns false if any index ran != once.
bool each_index_once(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  pool.parallel_for(n, min_chunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (auto& h : hits)
    if (h.load() != 1) return false;
  return true;
}

TEST(ThreadPool, ManyBackToBackLoopsCoverEveryIndexOnce) {
  ThreadPool pool(4);
  for (int round = 0; round < 3000; ++round) {
    const int64_t n = 1 + (round * 37) % 500;
    ASSERT_TRUE(each_index_once(pool, n, 1 + round % 7)) << "round " << round << ", n " << n;
  }
}

// More workers than cores, so that workers are preempted anywhere, and loops whose chunk
// counts alternate between small and large: a worker that saw the end of one loop must never
// claim a chunk of it once the next loop's arguments are being written (it would run the
// finished loop's function, or count a chunk the next loop does not have).
TEST(ThreadPool, PreemptedWorkersNeverTouchAFinishedLoop) {
  ThreadPool pool(8);
  for (int round = 0; round < 20000; ++round) {
    const int64_t n = round % 2 ? 1 + round % 5 : 300;
    std::vector<int> hits(static_cast<size_t>(n), 0);  // each index written by one chunk only
    pool.parallel_for(n, 1, [&hits, round](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)] += 1 + round % 3;
    });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<size_t>(i)], 1 + round % 3) << "round " << round << ", index " << i;
  }
}

TEST(ThreadPool, WakesWorkersThatWentToSleep) {
  ThreadPool pool(3);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(ThreadPool::kSpinNs * 3));  // workers sleep
    std::atomic<int> distinct_threads{0};
    std::atomic<bool> worker_entered{false};
    std::vector<std::thread::id> seen;
    std::mutex m;
    const auto caller = std::this_thread::get_id();
    // The caller's chunks wait (up to 30 s, not a time window a loaded machine could miss)
    // until a woken worker has entered one: without the wake-up none ever does, and the
    // caller runs them all.
    pool.parallel_for(64, 1, [&](int64_t, int64_t) {
      const auto id = std::this_thread::get_id();
      if (id == caller) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!worker_entered.load() && std::chrono::steady_clock::now() < give_up)
          std::this_thread::sleep_for(std::chrono::microseconds(100));
      } else {
        worker_entered.store(true);
      }
      std::lock_guard<std::mutex> g(m);
      if (std::find(seen.begin(), seen.end(), id) == seen.end()) {
        seen.push_back(id);
        distinct_threads.fetch_add(1);
      }
    });
    EXPECT_TRUE(worker_entered.load()) << "round " << round << ": only the caller ran chunks ("
                                       << distinct_threads.load() << " thread)";
    ASSERT_TRUE(each_index_once(pool, 1000, 1));
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerializedCorrectly) {
  ThreadPool pool(3);
  std::atomic<bool> ok{true};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&, t] {
      for (int round = 0; round < 300; ++round)
        if (!each_index_once(pool, 50 + t * 31 + round % 13, 1)) ok = false;
    });
  for (auto& c : callers) c.join();
  EXPECT_TRUE(ok.load());
}

TEST(ThreadPool, AnExceptionInATaskReachesTheCallerAndThePoolGoesOn) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b > 50) throw std::runtime_error("task failed");
                                 }),
               std::runtime_error);
  EXPECT_TRUE(each_index_once(pool, 777, 3));
}

TEST(ThreadPool, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  EXPECT_TRUE(each_index_once(pool, 100, 1));
}

}  // namespace
}  // namespace sluice
