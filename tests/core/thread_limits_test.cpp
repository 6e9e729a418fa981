// Thread counts out of range and threads the system cannot create: a one-line error, never a
// hang. SLUICE_THREADS=100000 made 32,259 threads and then deadlocked in the ThreadPool's
// constructor (a condition variable destroyed under its waiters), as did --threads 1000 under
// a memory limit; SLUICE_THREADS=abc, -5 and 1025 were taken silently.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "tests/tools/cli/cli_child.h"
#include "core/error.h"
#include "core/switches.h"
#include "core/thread_pool.h"

using namespace sluice;
using namespace sluice::test;

TEST(ThreadLimits, PoolSizesAreBounded) {
  EXPECT_THROW(ThreadPool(ThreadPool::kMaxThreads + 1), Error);
  // SLUICE_THREADS takes what --threads takes (the registry's bounds; switches_test.cpp checks
  // its values one by one).
  EXPECT_EQ(switches::info(Switch::threads).max, ThreadPool::kMaxThreads);
}

TEST(ThreadLimits, TheCliRefusesBadThreadCountsInOneLine) {
  const std::string model = std::string(SLUICE_SOURCE_DIR) + "/models/demo";
  for (const char* bad : {"abc", "-5", "1025", "100000"}) {
    ChildOptions co;
    co.env = {{"SLUICE_THREADS", bad}};
    const ChildResult r = run_sluice_child({"run", "--model", model, "--prompt", "a", "-n", "1", "--backend", "cpu"}, co);
    EXPECT_EQ(r.status, 1) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("SLUICE_THREADS=" + std::string(bad)), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// 1000 threads of 8 MiB stacks cannot start in 1.5 GB of address space: the run fails at once
// with a one-line error, the threads it started stopped, instead of hanging.
TEST(ThreadLimits, ThreadsTheSystemCannotStartAreAnErrorNotAHang) {
  const std::string model = std::string(SLUICE_SOURCE_DIR) + "/models/demo";
  for (bool by_env : {false, true}) {
    ChildOptions co;
    co.address_space_bytes = uint64_t{1500000} * 1024;
    std::vector<std::string> args = {"run", "--model", model, "--prompt", "a", "-n", "1", "--backend", "cpu"};
    if (by_env) co.env = {{"SLUICE_THREADS", "1000"}};
    else args.insert(args.end(), {"--threads", "1000"});
    const auto t0 = std::chrono::steady_clock::now();
    const ChildResult r = run_sluice_child(args, co);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find("cannot start 1000 threads"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}
