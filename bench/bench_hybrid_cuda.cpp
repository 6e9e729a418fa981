// bench_hybrid_cuda: the CUDA kernels of the hybrid families at the real models' sizes
// (Qwen3-Next / Qwen3.5: 32 value heads and 16 key heads of 128 dims, conv over 8192
// channels; qwen4-exp's hyper-connections: 4 streams of 2048). Prints a markdown table: time
// per call (median of 7 batches, each call followed by nothing: stream order only, one
// synchronize per batch), and for the memory-bound ops the bytes they must move over that
// time, next to the H200's measured device-to-device ceiling (about 4.3 TB/s read + write).
//
// Usage: bench_hybrid_cuda [seconds per row, default 0.3]. Needs a CUDA build and a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"

using namespace sluice;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median seconds per call over 7 batches of about budget / 7 each (a synchronize ends a batch).
double time_per_call(Backend& be, double budget, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  be.synchronize();
  auto t0 = Clock::now();
  int64_t probe = 0;
  while (seconds_since(t0) < 0.02) {
    fn();
    be.synchronize();
    ++probe;
  }
  const double per = seconds_since(t0) / probe;
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(budget / 7 / per));
  std::vector<double> batches;
  for (int b = 0; b < 7; ++b) {
    auto t = Clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    be.synchronize();
    batches.push_back(seconds_since(t) / calls);
  }
  std::sort(batches.begin(), batches.end());
  return batches[3];
}

Tensor random_tensor(Backend& be, std::initializer_list<int64_t> shape, float lo, float hi, uint32_t seed) {
  Tensor t = be.alloc(DType::f32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (auto& x : v) x = d(rng);
  be.from_host(t, v.data());
  return t;
}

constexpr double kD2dCeiling = 4.3e12;  // bytes/s read + write, an H200's measured device copy

void row(const std::string& op, const std::string& shape, double sec, double bytes) {
  if (bytes > 0)
    std::printf("| %s | %s | %.2f | %.1f | %.1f%% |\n", op.c_str(), shape.c_str(), sec * 1e6, bytes / sec / 1e9,
                100.0 * bytes / sec / kD2dCeiling);
  else
    std::printf("| %s | %s | %.2f | - | - |\n", op.c_str(), shape.c_str(), sec * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 0.3;
  std::unique_ptr<Backend> be;
  try {
    be = make_cuda_backend(0);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_hybrid_cuda: %s\n", e.what());
    return 2;
  }
  std::printf("%s\n\n| op | shape | us/call | GB/s | of d2d ceiling |\n|---|---|---|---|---|\n", be->name().c_str());
  const int64_t hk = 16, hv = 32, dk = 128, dv = 128, conv = 2 * hk * dk + hv * dv;
  const double state_bytes = 2.0 * hv * dk * dv * 4;  // read + write
  for (int64_t n : {1, 16, 512}) {
    Tensor q = random_tensor(*be, {n, hk, dk}, -1, 1, 1), k = random_tensor(*be, {n, hk, dk}, -1, 1, 2);
    Tensor v = random_tensor(*be, {n, hv, dv}, -1, 1, 3), g = random_tensor(*be, {n, hv}, -1, 0, 4);
    Tensor beta = random_tensor(*be, {n, hv}, 0, 1, 5), state = random_tensor(*be, {hv, dk, dv}, -0.1f, 0.1f, 6);
    Tensor out = be->alloc(DType::f32, {n, hv, dv});
    DeltaRuleParams p;
    p.chunk_size = n > 1 ? 64 : 0;
    const double sec = time_per_call(*be, budget, [&] { be->gated_delta_rule(q, k, v, g, beta, state, out, p); });
    row("gated_delta_rule", "n=" + std::to_string(n) + " Hv=32 Hk=16 dk=dv=128", sec,
        state_bytes + 4.0 * n * (2 * hk * dk + 2 * hv * dv + 2 * hv));
  }
  for (int64_t n : {1, 512}) {
    Tensor x = random_tensor(*be, {n, conv}, -1, 1, 7), w = random_tensor(*be, {conv, 4}, -1, 1, 8);
    Tensor st = random_tensor(*be, {3, conv}, -1, 1, 9), out = be->alloc(DType::f32, {n, conv});
    const double sec = time_per_call(*be, budget, [&] { be->causal_conv1d(x, w, st, out, 1, true); });
    row("causal_conv1d", "n=" + std::to_string(n) + " c=8192 K=4", sec, 4.0 * (2 * n * conv + 2 * 3 * conv + 4 * conv));
  }
  {
    const int64_t n = 1, ns = 4, c = 2048;
    Tensor x = random_tensor(*be, {n, ns * c}, -1, 1, 10), lg = random_tensor(*be, {n, ns * c}, -1, 1, 11);
    Tensor out = be->alloc(DType::f32, {n, c}), y = random_tensor(*be, {n, c}, -1, 1, 12);
    Tensor w = random_tensor(*be, {n, ns}, 0, 2, 13), xn = be->alloc(DType::f32, {n, ns * c});
    row("rms_norm_groups", "n=1 4 x 2048", time_per_call(*be, budget, [&] { be->rms_norm_groups(x, Tensor{}, 1e-6f, c, xn); }), 0);
    row("hyper_mix", "n=1 4 x 2048", time_per_call(*be, budget, [&] { be->hyper_mix(x, lg, out); }), 0);
    row("hyper_inject", "n=1 4 x 2048", time_per_call(*be, budget, [&] { be->hyper_inject(x, y, w); }), 0);
  }
  for (int64_t n_ctx : {4096, 32768}) {
    const int64_t n_head = 16, d = 128, c = 4, topk = 512, m = n_ctx / c;
    Tensor q = random_tensor(*be, {1, n_head, d}, -1, 1, 14), bk = random_tensor(*be, {m, d}, -1, 1, 15);
    Tensor idx = be->alloc(DType::i32, {1, topk * c + c - 1});
    QsaParams p;
    p.n_past = n_ctx - 1;
    p.compress_ratio = c;
    p.block_topk = topk;
    row("qsa_select", "decode, " + std::to_string(m) + " blocks, 16 heads x 128, top 512",
        time_per_call(*be, budget, [&] { be->qsa_select(q, bk, idx, p); }), 4.0 * m * d);
  }
  return 0;
}
