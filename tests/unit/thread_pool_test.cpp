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

TEST(ThreadPool, WakesWorkersThatWentToSleep) {
  ThreadPool pool(3);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(ThreadPool::kSpinNs * 3));  // workers sleep
    std::atomic<int> distinct_threads{0};
    std::vector<std::thread::id> seen;
    std::mutex m;
    // Chunks long enough that the woken workers take some of them.
    pool.parallel_for(64, 1, [&](int64_t, int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard<std::mutex> g(m);
      const auto id = std::this_thread::get_id();
      if (std::find(seen.begin(), seen.end(), id) == seen.end()) {
        seen.push_back(id);
        distinct_threads.fetch_add(1);
      }
    });
    EXPECT_GT(distinct_threads.load(), 1) << "round " << round << ": only the caller ran chunks";
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
