// bench_matmul: CPU matmul y[n, m] = x[n, k] . w[m, k]^T for f32 and bf16 weights, decode
// (n = 1) and small-batch prefill (n = 16) shapes. Prints a markdown table: time per call,
// GB/s of weight bytes read and GFLOP/s, next to the machine's ceilings measured here (read
// bandwidth of a buffer far larger than the caches, and the FMA peak of the thread pool).
//
// "hot": the same weights every call (they stay in the last-level cache when they fit).
// "cold": calls rotate over copies totalling 512 MiB, as a decode step does over layers, so
// every call reads its weights from DRAM.
//
// Usage: bench_matmul [seconds per row, default 0.3] [n: only rows with this n].
// Threads: SLUICE_THREADS (default: all).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"

using namespace sluice;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median seconds per call of fn(i) (i counts calls), over 7 batches of about budget/7 each.
template <typename Fn>
double time_per_call(double budget, Fn&& fn) {
  int64_t calls = 0;
  for (auto t0 = Clock::now(); seconds_since(t0) < 0.02 || calls < 2;) fn(calls++);  // warm-up
  auto t0 = Clock::now();
  int64_t probe = 0;
  while (seconds_since(t0) < 0.02) fn(calls + probe++);
  double per = seconds_since(t0) / probe;
  int64_t reps = std::max<int64_t>(1, static_cast<int64_t>(budget / 7 / per));
  std::vector<double> batches;
  for (int b = 0; b < 7; ++b) {
    auto tb = Clock::now();
    for (int64_t r = 0; r < reps; ++r) fn(calls++);
    batches.push_back(seconds_since(tb) / reps);
  }
  std::sort(batches.begin(), batches.end());
  return batches[3];
}

// Read bandwidth ceiling: every thread sums its share of a 512 MiB buffer with AVX2 loads.
double measure_read_gbps(ThreadPool& pool, double budget) {
  const size_t n = (512u << 20) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  std::vector<float> sink(static_cast<size_t>(pool.size()) * 64);
  double t = time_per_call(budget, [&](int64_t) {
    pool.parallel_for(static_cast<int64_t>(n / 32), 4096, [&](int64_t b0, int64_t b1) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t b = b0; b < b1; ++b) {
        const float* p = buf.data() + b * 32;
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + 24));
      }
      __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      _mm256_storeu_ps(sink.data() + (b0 % pool.size()) * 8, s);
    });
  });
  return n * sizeof(float) / t / 1e9;
}

// FMA peak: 10 independent accumulator chains per thread, no memory traffic.
double measure_fma_gflops(ThreadPool& pool, double budget) {
  const int64_t iters = 1 << 20;
  std::vector<float> sink(static_cast<size_t>(pool.size()) * 8);
  double t = time_per_call(budget, [&](int64_t) {
    pool.parallel_for(pool.size(), 1, [&](int64_t t0, int64_t t1) {
      for (int64_t th = t0; th < t1; ++th) {
        __m256 a[10];
        for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
        const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
        for (int64_t it = 0; it < iters; ++it)
          for (int i = 0; i < 10; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
        __m256 s = a[0];
        for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, a[i]);
        _mm256_storeu_ps(sink.data() + th * 8, s);
      }
    });
  });
  return pool.size() * iters * 10.0 * 16 / t / 1e9;
}

struct Row {
  DType dtype;
  int64_t m, k, n;
};

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 0.3;
  const int64_t only_n = argc > 2 ? std::atoll(argv[2]) : 0;
  ThreadPool& pool = ThreadPool::global();
  CpuBackend be;
  const double read_gbps = measure_read_gbps(pool, budget);
  const double fma_gflops = measure_fma_gflops(pool, budget);
  std::printf("CPU matmul, %d threads. Ceilings measured here: DRAM read %.1f GB/s, FMA peak %.1f GFLOP/s.\n\n",
              pool.size(), read_gbps, fma_gflops);
  std::printf("| weights | m | k | n | cache | us/call | weight GB/s | GFLOP/s |\n");
  std::printf("|---|---:|---:|---:|---|---:|---:|---:|\n");

  const Row rows[] = {
      {DType::bf16, 2048, 2048, 1}, {DType::bf16, 2048, 2048, 16}, {DType::bf16, 768, 2048, 1},
      {DType::bf16, 768, 2048, 16}, {DType::f32, 2048, 2048, 1},   {DType::f32, 2048, 2048, 16},
      {DType::f32, 768, 2048, 1},   {DType::f32, 768, 2048, 16},
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Row& r : rows) {
    if (only_n && r.n != only_n) continue;
    const size_t w_bytes = static_cast<size_t>(r.m * r.k) * dtype_size(r.dtype);
    const int copies = static_cast<int>(std::max<size_t>(2, (512u << 20) / w_bytes));
    std::vector<Tensor> ws;
    for (int c = 0; c < copies; ++c) {
      Tensor w = be.alloc(r.dtype, {r.m, r.k});
      if (c == 0) {  // random values in the first copy, the others are copies of it
        if (r.dtype == DType::f32) {
          for (int64_t i = 0; i < r.m * r.k; ++i) w.ptr<float>()[i] = dist(rng);
        } else {
          for (int64_t i = 0; i < r.m * r.k; ++i) w.ptr<uint16_t>()[i] = f32_to_bf16(dist(rng));
        }
      } else {
        be.copy(ws[0], w);
      }
      ws.push_back(w);
    }
    Tensor x = be.alloc(DType::f32, {r.n, r.k});
    for (int64_t i = 0; i < r.n * r.k; ++i) x.ptr<float>()[i] = dist(rng);
    Tensor y = be.alloc(DType::f32, {r.n, r.m});
    for (bool cold : {false, true}) {
      double t = time_per_call(budget, [&](int64_t i) { be.matmul(x, cold ? ws[i % copies] : ws[0], y); });
      std::printf("| %s | %lld | %lld | %lld | %s | %.1f | %.1f | %.1f |\n", std::string(dtype_name(r.dtype)).c_str(),
                  static_cast<long long>(r.m), static_cast<long long>(r.k), static_cast<long long>(r.n),
                  cold ? "cold" : "hot", t * 1e6, w_bytes / t / 1e9, 2.0 * r.n * r.m * r.k / t / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
