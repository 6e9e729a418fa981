// bench_cuda: GPU speed against the device's measured memory bandwidth.
//
//   bench_cuda --matvec            decode matrix-vector products (n = 1) of large weights in
//                                  every dtype: GB/s of weight bytes read, next to the measured
//                                  device-to-device copy bandwidth (read + write bytes / s);
//   bench_cuda --attention         prefill attention kernels (causal, grouped-query) at prompt
//                                  lengths 512 to 8192: us per call of the f32 per-row kernel
//                                  and of the tensor-core flash kernel, and the flash kernel's
//                                  TFLOP/s of useful work (4 d flops per visible (query, key)
//                                  pair and head) next to the ceiling it is bounded by;
//   bench_cuda --attention-decode  decode attention (one query row, attention_decode.cu) at
//                                  contexts 512 to 32768 for grouped-query shapes of the
//                                  qwen3 families: us per call (back to back, chained
//                                  launches), GB/s of K and V cache bytes read, next to the
//                                  measured copy bandwidth (SLUICE_CUDA_GQA_SHAPE=HPW,C,NST,S
//                                  overrides the kernel's launch shape, to explore it);
//   bench_cuda --moe               the decode MoE expert kernels (moe_kernels.h) of a
//                                  qwen3-30b-a3b-shaped layer (hidden 2048, 128 experts of
//                                  width 768, top-8) for bf16, int8 and q4 experts at 1, 2, 4
//                                  and 8 rows: us per launch of each kernel (from HBM: every
//                                  call routes to other experts) with the generic kernels
//                                  (SLUICE_CUDA_MOE_DECODE=0) and the decode kernels, GB/s of
//                                  expert bytes read, next to the measured copy bandwidth;
//                                  then the routed layer from router logits (the top-k and
//                                  the experts, three chained launches), us a call;
//   bench_cuda --read-wave         one launch in the q4 MoE gate/up kernel's grid reading a
//                                  layer's 14.2 MB cold in L2 by 16-byte loads, cp.async and
//                                  cp.async.bulk (bench/cuda/read_wave.cu): the floor of a
//                                  one-wave kernel over those bytes;
//   bench_cuda --model PACK [--prefill 512] [--decode 64] [--reps 3]
//                                  a qwen3_moe-family model fully resident on the GPU: prefill
//                                  tokens/s for one prompt chunk, decode tokens/s (batch 1),
//                                  and the decode roofline: bytes one decode step touches
//                                  (active experts, attention, router, lm head, KV cache, each
//                                  listed) over the measured copy bandwidth.
//     [--replay-routing TRACE [--replay-map auto|ids|fit]]
//                                  every MoE layer's routing from a recorded trace instead of
//                                  its router (experts/routing_replay.h: the device stores the
//                                  replay's rows where its top-k would), so the rows touch
//                                  the experts a trained model's routing would; a replayed
//                                  step runs eagerly, never as a captured graph (the header
//                                  line says so)
//     [--batch 1,8,32]             and batch decode: B sequences after the same-length prompt
//                                  decode together (Model::forward_batch_sample, greedy, the
//                                  server's step): total tokens/s of the steady steps and the
//                                  first step's ms (it captures the batch graph), next to the
//                                  same steps with the logits copied out and drawn on the host.
// Prints markdown tables. Without a CUDA build it says so and exits 1.
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/quant.h"
#include "core/sampling.h"
#include "engine/generator.h"
#include "experts/routing_replay.h"
#include "experts/simulate.h"
#include "models/load.h"

#ifdef SLUICE_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/read_wave.h"

#include "backends/cuda/attention_decode.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/moe_kernels.h"
#include "core/switches.h"
#endif

using namespace sluice;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#ifdef SLUICE_HAVE_CUDA
// Device-to-device copy of a 1 GiB buffer: (read + write) bytes per second.
double copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const int reps = 10;
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double s = seconds_since(t0);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * reps / s;
}
#endif

// A host weight [m, k] of random values in dtype t (quantized with quantize_row).
struct HostWeight {
  std::vector<uint8_t> data, scales;
  Tensor t;
  HostWeight(DType dt, int64_t m, int64_t k) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    std::vector<float> row(k);
    t = Tensor(dt, {m, k}, nullptr);
    const bool q = dtype_is_quantized(dt);
    const int64_t rb = q ? quant_row_bytes(dt, k) : k * static_cast<int64_t>(dtype_size(dt));
    const int64_t sb = q ? quant_scale_row_bytes(dt, k) : 0;
    data.resize(m * rb);
    scales.resize(m * sb);
    for (int64_t r = 0; r < m; ++r) {
      for (auto& v : row) v = nd(rng);
      uint8_t* dst = data.data() + r * rb;
      if (q) quantize_row(dt, row.data(), k, dst, scales.data() + r * sb);
      else if (dt == DType::f32) std::memcpy(dst, row.data(), k * 4);
      else
        for (int64_t c = 0; c < k; ++c) {
          uint16_t h = f32_to_bf16(row[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
    }
    t.data = data.data();
    t.scales = q ? scales.data() : nullptr;
  }
};

#ifdef SLUICE_HAVE_CUDA
// Prefill attention over one prompt chunk: q [n, hq, d] at positions n_past.., the cache
// [n_past + n, hkv, d]; random f32 inputs.
int run_attention() {
  // H200: ~989 dense bf16 TFLOP/s; the split-bf16 products take 3 mma each, so a third of it
  // is the flash kernel's ceiling in useful flops.
  constexpr double kPeakBf16 = 989e12;
  std::printf("prefill attention (f32 in and out); flash ceiling: 1/3 of %.0f bf16 TFLOP/s (3 mma a product)\n\n",
              kPeakBf16 / 1e12);
  std::printf("| n | n_past | hq / hkv | d | window | rows kernel us | flash us | speedup | flash TFLOP/s | of ceiling |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  struct Case {
    int64_t n, n_past, hq, hkv, d, window;
  };
  for (Case c : {Case{512, 0, 32, 4, 128, 0}, {2048, 0, 32, 4, 128, 0}, {8192, 0, 32, 4, 128, 0},
                 {512, 7680, 32, 4, 128, 0}, {8192, 0, 32, 4, 128, 4096}, {2048, 0, 64, 8, 64, 0},
                 {2048, 0, 16, 8, 256, 0}}) {
    const int64_t ctx = c.n_past + c.n;
    const size_t q_floats = static_cast<size_t>(c.n * c.hq * c.d), kv_floats = static_cast<size_t>(ctx * c.hkv * c.d);
    std::vector<float> host(std::max(q_floats, kv_floats));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : host) x = nd(rng);
    float *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
    CUDA_CHECK(cudaMalloc(&q, q_floats * 4));
    CUDA_CHECK(cudaMalloc(&out, q_floats * 4));
    CUDA_CHECK(cudaMalloc(&k, kv_floats * 4));
    CUDA_CHECK(cudaMalloc(&v, kv_floats * 4));
    CUDA_CHECK(cudaMemcpy(q, host.data(), q_floats * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(k, host.data(), kv_floats * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(v, host.data(), kv_floats * 4, cudaMemcpyHostToDevice));
    const cuda::AttentionParams ap{.q = q, .k = k, .v = v, .out = out, .n = c.n, .hq = c.hq, .hkv = c.hkv, .d = c.d,
                                   .n_past = c.n_past, .scale = 1.0f / std::sqrt(static_cast<float>(c.d)),
                                   .window = c.window};
    auto time_us = [&](void (*launch)(const cuda::AttentionParams&, cuda::Stream), int reps) {
      launch(ap, nullptr);  // warm-up
      CUDA_CHECK(cudaDeviceSynchronize());
      auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) launch(ap, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      return seconds_since(t0) / reps * 1e6;
    };
    const double rows_us = time_us(cuda::launch_attention_rows, 2), flash_us = time_us(cuda::launch_attention_flash, 10);
    double pairs = 0;  // visible (query, key) pairs
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t pos = c.n_past + i;
      pairs += static_cast<double>(c.window > 0 ? std::min(c.window, pos + 1) : pos + 1);
    }
    const double tflops = 4.0 * c.d * c.hq * pairs / (flash_us * 1e-6) / 1e12;
    std::printf("| %lld | %lld | %lld / %lld | %lld | %lld | %.0f | %.0f | %.1fx | %.1f | %.0f%% |\n",
                static_cast<long long>(c.n), static_cast<long long>(c.n_past), static_cast<long long>(c.hq),
                static_cast<long long>(c.hkv), static_cast<long long>(c.d), static_cast<long long>(c.window), rows_us,
                flash_us, rows_us / flash_us, tflops, 100.0 * tflops * 1e12 / (kPeakBf16 / 3));
    for (float* ptr : {q, k, v, out}) CUDA_CHECK(cudaFree(ptr));
  }
  return 0;
}

// Decode attention for one query row at position ctx - 1 of a cache of capacity ctx; random
// f32 inputs; 200 launches back to back on one stream (chained as in a decode step).
int run_attention_decode(double copy_bw) {
  std::printf("decode attention, one query row at the cache's last position, f32 and bf16 caches; copy bandwidth "
              "%.0f GB/s\n\n", copy_bw / 1e9);
  std::printf("| hq / hkv | d | context | cache | splits | us | K+V GB/s | of copy bandwidth |\n"
              "|---|---|---|---|---|---|---|---|\n");
  struct Case {
    int64_t hq, hkv, d;
  };
  for (Case c : {Case{32, 4, 128}, Case{64, 4, 128}, Case{16, 2, 256}, Case{32, 8, 128}}) {
    for (int64_t ctx : {512, 2048, 8192, 32768})
    for (bool bf16 : {false, true}) {
      const size_t elem = bf16 ? 2 : 4;
      const size_t q_floats = static_cast<size_t>(c.hq * c.d), kv_floats = static_cast<size_t>(ctx * c.hkv * c.d);
      std::vector<float> host(kv_floats);
      std::mt19937 rng(5);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& x : host) x = nd(rng);
      std::vector<uint16_t> host16(bf16 ? kv_floats : 0);
      if (bf16) dtype_convert_row(host.data(), DType::f32, host16.data(), DType::bf16, static_cast<int64_t>(kv_floats));
      const void* kv_host = bf16 ? static_cast<const void*>(host16.data()) : host.data();
      float *q = nullptr, *out = nullptr, *partials = nullptr;
      void *k = nullptr, *v = nullptr;
      const int64_t part = cuda::attention_decode_partial_floats(c.hq, c.hkv, c.d, ctx);
      CUDA_CHECK(cudaMalloc(&q, q_floats * 4));
      CUDA_CHECK(cudaMalloc(&out, q_floats * 4));
      CUDA_CHECK(cudaMalloc(&k, kv_floats * elem));
      CUDA_CHECK(cudaMalloc(&v, kv_floats * elem));
      CUDA_CHECK(cudaMalloc(&partials, static_cast<size_t>(part) * 4));
      CUDA_CHECK(cudaMemcpy(q, host.data(), q_floats * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(k, kv_host, kv_floats * elem, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(v, kv_host, kv_floats * elem, cudaMemcpyHostToDevice));
      cuda::AttentionDecodeParams a;
      a.q = q, a.k = k, a.v = v, a.kv_bf16 = bf16, a.out = out, a.partials = partials;
      a.hq = c.hq, a.hkv = c.hkv, a.d = c.d, a.n_ctx = ctx, a.n_past = ctx - 1;
      a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      cudaStream_t st = nullptr;
      CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      for (int i = 0; i < 10; ++i) cuda::launch_attention_decode(a, st);  // warm-up
      CUDA_CHECK(cudaStreamSynchronize(st));
      constexpr int kReps = 200;
      auto t0 = Clock::now();
      for (int i = 0; i < kReps; ++i) cuda::launch_attention_decode(a, st);
      CUDA_CHECK(cudaStreamSynchronize(st));
      const double us = seconds_since(t0) / kReps * 1e6, bytes = 2.0 * static_cast<double>(kv_floats * elem);
      std::printf("| %lld / %lld | %lld | %lld | %s | %d | %.2f | %.0f | %.0f%% |\n", static_cast<long long>(c.hq),
                  static_cast<long long>(c.hkv), static_cast<long long>(c.d), static_cast<long long>(ctx),
                  bf16 ? "bf16" : "f32", cuda::attention_decode_launch_splits(a), us, bytes / us / 1e3,
                  100.0 * bytes / (us * 1e-6) / copy_bw);
      CUDA_CHECK(cudaStreamDestroy(st));
      for (void* ptr : {static_cast<void*>(q), k, v, static_cast<void*>(out), static_cast<void*>(partials)})
        CUDA_CHECK(cudaFree(ptr));
    }
  }
  return 0;
}
#endif

int run_matvec(double copy_bw) {
  auto gpu = make_cuda_backend(0);
  std::printf("device copy bandwidth (read + write): %.0f GB/s\n\n", copy_bw / 1e9);
  std::printf("| weight | m x k | MB | us / call | GB/s read | of copy bw |\n|---|---|---|---|---|---|\n");
  struct Case {
    DType dt;
    int64_t m, k;
  };
  for (Case c : {Case{DType::f32, 8192, 4096}, {DType::bf16, 16384, 4096}, {DType::bf16, 151936, 2048},
                 {DType::bf16, 4096, 2048}, {DType::q8, 16384, 4096}, {DType::q4, 16384, 4096},
                 {DType::q4, 768, 2048}, {DType::q2, 16384, 4096}}) {
    HostWeight hw(c.dt, c.m, c.k);
    // Copies rotating over more than the 50 MB L2, so each call reads from HBM.
    const size_t bytes = hw.t.nbytes() + hw.t.scale_nbytes();
    const int copies = static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / bytes + 1));
    std::vector<Tensor> w;
    for (int i = 0; i < std::min(copies, 64); ++i) w.push_back(gpu->upload(hw.t));
    Tensor x = gpu->alloc(DType::f32, {1, c.k}), y = gpu->alloc(DType::f32, {1, c.m});
    gpu->fill(x, 0.5f);
    for (auto& wi : w) gpu->matmul(x, wi, y);
    gpu->synchronize();
    const int reps = std::max(20, static_cast<int>(4e9 / bytes));
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) gpu->matmul(x, w[i % w.size()], y);
    gpu->synchronize();
    const double s = seconds_since(t0) / reps;
    std::printf("| %s | %lld x %lld | %.1f | %.1f | %.0f | %.0f%% |\n", std::string(dtype_name(c.dt)).c_str(),
                static_cast<long long>(c.m), static_cast<long long>(c.k), bytes / 1e6, s * 1e6, bytes / s / 1e9,
                100.0 * bytes / s / copy_bw);
  }
  return 0;
}

#ifdef SLUICE_HAVE_CUDA
// The MoE kernels' role in a layer's launches, from the kernel's name: "moe_decode_gate_up_kernel"
// and "moe_gate_up_kernel" -> "gate_up".
std::string moe_kernel_role(const void* func) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, func) != cudaSuccess || !mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  s = s.substr(0, s.find_first_of("<("));  // "void sluice::cuda::(anonymous namespace)::moe_mark_kernel"
  s = s.substr(s.rfind("::") == std::string::npos ? 0 : s.rfind("::") + 2);
  for (const char* prefix : {"moe_", "decode_"})
    if (s.rfind(prefix, 0) == 0) s.erase(0, std::string(prefix).size());
  if (s.size() > 7 && s.compare(s.size() - 7, 7, "_kernel") == 0) s.erase(s.size() - 7);
  return s;
}

// us per replay of graph g over `calls` calls of the launches it holds (a warm-up first).
double graph_us(cudaGraph_t g, cudaStream_t st, int calls) {
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  const int reps = 20;
  auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) CUDA_CHECK(cudaGraphLaunch(exec, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  const double us = seconds_since(t0) * 1e6 / (reps * calls);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  return us;
}

// Per kernel role, us a launch: a graph of that kernel's nodes of g alone, one after another.
// reset runs before each (the done flags the phase kernels read).
std::map<std::string, double> kernel_us(cudaGraph_t g, cudaStream_t st, const std::function<void()>& reset) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::map<std::string, std::vector<cudaKernelNodeParams>> by_role;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams p{};
    CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &p));
    by_role[moe_kernel_role(p.func)].push_back(p);
  }
  std::map<std::string, double> us;
  for (const auto& [role, params] : by_role) {
    cudaGraph_t alone = nullptr;
    CUDA_CHECK(cudaGraphCreate(&alone, 0));
    cudaGraphNode_t prev = nullptr;
    for (const cudaKernelNodeParams& p : params) {
      cudaGraphNode_t node = nullptr;
      CUDA_CHECK(cudaGraphAddKernelNode(&node, alone, prev ? &prev : nullptr, prev ? 1 : 0, &p));
      prev = node;
    }
    reset();
    us[role] = graph_us(alone, st, static_cast<int>(params.size()));
    CUDA_CHECK(cudaGraphDestroy(alone));
  }
  return us;
}

// The decode MoE kernels on a qwen3-30b-a3b-shaped layer, generic against decode kernels.
int run_moe(double copy_bw) {
  constexpr int64_t kEmbd = 2048, kFf = 768, kExperts = 128, kTopK = 8;
  constexpr int kCalls = 16;  // routings a graph holds, each on other experts than the last
  auto gpu = make_cuda_backend(0);
  cudaStream_t st = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("MoE expert kernels, hidden %lld, %lld experts of width %lld, top-%lld; us a launch, each call "
              "routed to other experts (weights read from HBM); device copy bandwidth (read + write) %.0f GB/s\n"
              "resident: gate_up + down_combine (launch_moe_experts_combine); streamed: a phase "
              "(launch_moe_experts: gate_up, down, mark) + combine_done; layer: the whole call in a graph\n\n",
              static_cast<long long>(kEmbd), static_cast<long long>(kExperts), static_cast<long long>(kFf),
              static_cast<long long>(kTopK), copy_bw / 1e9);
  std::printf("| wtype | rows | path | kernel | MB read | generic us | decode us | speedup | decode GB/s | of copy bw |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  std::string routed_rows;  // the second table's
  for (DType dt : {DType::bf16, DType::q8, DType::q4}) {
    HostWeight gate(dt, kFf, kEmbd), up(dt, kFf, kEmbd), down(dt, kEmbd, kFf);
    std::vector<Tensor> weights;  // gate, up, down of each expert
    std::vector<cuda::ExpertRef> refs(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) {
      for (const HostWeight* w : {&gate, &up, &down}) weights.push_back(gpu->upload(w->t));
      for (int m = 0; m < 3; ++m) {
        refs[e].data[m] = weights[weights.size() - 3 + m].data;
        refs[e].scales[m] = weights[weights.size() - 3 + m].scales;
      }
      refs[e].wtype = cuda::wtype_of(dt, "bench");
    }
    Tensor table = gpu->alloc(DType::u8, {kExperts * static_cast<int64_t>(sizeof(cuda::ExpertRef))});
    gpu->from_host(table, refs.data());
    const auto* dtable = static_cast<const cuda::ExpertRef*>(table.data);
    const double gate_up_bytes = 2.0 * static_cast<double>(gate.t.nbytes() + gate.t.scale_nbytes());
    const double down_bytes = static_cast<double>(down.t.nbytes() + down.t.scale_nbytes());
    for (int64_t n : {1, 2, 4, 8}) {
      const int64_t pairs = n * kTopK;
      std::vector<int32_t> ids(kCalls * pairs);
      for (int64_t i = 0; i < kCalls * pairs; ++i) ids[i] = static_cast<int32_t>(i % kExperts);
      Tensor d_ids = gpu->alloc(DType::i32, {kCalls * pairs});
      gpu->from_host(d_ids, ids.data());
      Tensor w = gpu->alloc(DType::f32, {pairs}), h = gpu->alloc(DType::f32, {n, kEmbd});
      gpu->fill(w, 1.0f / kTopK);
      gpu->fill(h, 0.25f);
      Tensor done = gpu->alloc(DType::u8, {kCalls * pairs}), act = gpu->alloc(DType::f32, {pairs, kFf});
      Tensor pair_out = gpu->alloc(DType::f32, {pairs, kEmbd}), out = gpu->alloc(DType::f32, {n, kEmbd});
      gpu->synchronize();
      const cuda::MoeShape shape{n, kTopK, kEmbd, kFf, kExperts, cuda::wtype_of(dt, "bench")};
      auto reset = [&] { CUDA_CHECK(cudaMemsetAsync(done.data, 0, static_cast<size_t>(kCalls * pairs), st)); };
      for (const char* path : {"resident", "streamed"}) {
        const bool resident = std::strcmp(path, "resident") == 0;
        std::map<std::string, double> us[2];  // generic, decode
        for (int variant = 0; variant < 2; ++variant) {
          setenv("SLUICE_CUDA_MOE_DECODE", variant ? "1" : "0", 1);
          switches::reload();
          cudaGraph_t g = nullptr;
          CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          for (int c = 0; c < kCalls; ++c) {
            const int32_t* call_ids = d_ids.ptr<int32_t>() + c * pairs;
            uint8_t* call_done = static_cast<uint8_t*>(done.data) + c * pairs;
            if (resident) {
              cuda::launch_moe_experts_combine(h.ptr<float>(), call_ids, w.ptr<float>(), dtable, act.ptr<float>(),
                                               out.ptr<float>(), shape, st);
            } else {
              CUDA_CHECK(cudaMemsetAsync(call_done, 0, static_cast<size_t>(pairs), st));
              cuda::launch_moe_experts(h.ptr<float>(), call_ids, dtable, call_done, act.ptr<float>(),
                                       pair_out.ptr<float>(), shape, st);
              cuda::launch_moe_combine_done(pair_out.ptr<float>(), w.ptr<float>(), call_done, out.ptr<float>(), shape,
                                            st);
            }
          }
          CUDA_CHECK(cudaStreamEndCapture(st, &g));
          us[variant] = kernel_us(g, st, reset);
          us[variant]["layer"] = graph_us(g, st, kCalls);
          CUDA_CHECK(cudaGraphDestroy(g));
        }
        unsetenv("SLUICE_CUDA_MOE_DECODE");
        switches::reload();
        // Rows in launch order; the generic and decode kernels of a role side by side.
        const std::vector<std::string> roles = resident ? std::vector<std::string>{"gate_up", "down_combine", "layer"}
                                                        : std::vector<std::string>{"gate_up", "down", "mark",
                                                                                   "combine_done", "layer"};
        for (const std::string& role : roles) {
          const double bytes = pairs * (role == "gate_up"                          ? gate_up_bytes
                                        : role == "down" || role == "down_combine" ? down_bytes
                                        : role == "layer"                          ? gate_up_bytes + down_bytes
                                                                                   : 0.0);
          const double g_us = us[0].count(role) ? us[0][role] : 0, d_us = us[1].count(role) ? us[1][role] : 0;
          std::printf("| %s | %lld | %s | %s | %.2f | %.2f | %.2f | %.2fx |", std::string(dtype_name(dt)).c_str(),
                      static_cast<long long>(n), path, role.c_str(), bytes / 1e6, g_us, d_us, d_us > 0 ? g_us / d_us : 0.0);
          if (bytes > 0 && d_us > 0)
            std::printf(" %.0f | %.0f%% |\n", bytes / (d_us * 1e-6) / 1e9, 100.0 * bytes / (d_us * 1e-6) / copy_bw);
          else
            std::printf(" - | - |\n");
        }
      }
      // The routed layer from router logits (each call on other logits, so other experts):
      // the top-k and the experts, three chained launches.
      std::vector<float> lv(static_cast<size_t>(kCalls * n * kExperts));
      std::mt19937 rng(static_cast<uint32_t>(n));
      std::normal_distribution<float> normal(0.0f, 1.5f);
      for (float& x : lv) x = normal(rng);
      Tensor d_logits = gpu->alloc(DType::f32, {kCalls * n, kExperts});
      gpu->from_host(d_logits, lv.data());
      Tensor r_ids = gpu->alloc(DType::i32, {pairs}), r_w = gpu->alloc(DType::f32, {pairs});
      gpu->synchronize();
      cudaGraph_t g = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int c = 0; c < kCalls; ++c) {
        const float* call_logits = d_logits.ptr<float>() + c * n * kExperts;
        cuda::launch_router_topk(call_logits, n, kExperts, kTopK, true, r_ids.ptr<int32_t>(), r_w.ptr<float>(), st);
        cuda::launch_moe_experts_combine(h.ptr<float>(), r_ids.ptr<int32_t>(), r_w.ptr<float>(), dtable,
                                         act.ptr<float>(), out.ptr<float>(), shape, st);
      }
      CUDA_CHECK(cudaStreamEndCapture(st, &g));
      const double route_us = graph_us(g, st, kCalls);
      CUDA_CHECK(cudaGraphDestroy(g));
      char row[256];
      std::snprintf(row, sizeof row, "| %s | %lld | %.2f | %.0f |\n", std::string(dtype_name(dt)).c_str(),
                    static_cast<long long>(n), route_us, pairs * (gate_up_bytes + down_bytes) / (route_us * 1e-6) / 1e9);
      routed_rows += row;
    }
  }
  std::printf("\nThe routed layer from router logits, us a call in a graph of %d: top-k + experts (three chained "
              "launches)\n\n| wtype | rows | us | expert GB/s |\n|---|---|---|---|\n%s",
              kCalls, routed_rows.c_str());
  CUDA_CHECK(cudaStreamDestroy(st));
  return 0;
}
#endif

double expert_bytes_per_weight(DType k, int64_t cols) {
  switch (k) {
    case DType::bf16: return 2.0;
    case DType::q8: return 1.0 + 4.0 / cols;
    case DType::q4: return 18.0 / 32.0;
    case DType::q2: return 8.0 / 16.0;
    default: break;
  }
  return 0;
}

// Batch decode of B sequences (module comment). Each sequence's prompt is the shared one
// rotated by b tokens, so the rows route to different experts.
void run_batch(Model& model, const std::vector<int32_t>& prompt, int64_t n_decode, const std::vector<int64_t>& batches) {
  const int64_t V = model.info().n_vocab;
  std::printf("\n| batch | steady total tok/s | ms / step | first step ms (capture) |"
              " logits to host + host draw: total tok/s | ms / step |\n|---|---|---|---|---|---|\n");
  for (const int64_t B : batches) {
    double tps[2] = {0, 0}, step_ms[2] = {0, 0}, first_ms = 0;
    for (int host_draw = 0; host_draw < 2; ++host_draw) {
      std::vector<std::unique_ptr<SequenceState>> st;
      std::vector<SequenceState*> states;
      std::vector<int32_t> tokens(static_cast<size_t>(B)), next(static_cast<size_t>(B));
      std::vector<float> logits(static_cast<size_t>(V));
      for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> p(prompt);
        std::rotate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(b % static_cast<int64_t>(p.size())), p.end());
        st.push_back(model.new_state(static_cast<int64_t>(p.size()) + n_decode + 1));
        model.forward(p, *st.back(), logits, false);
        states.push_back(st.back().get());
        tokens[static_cast<size_t>(b)] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      const std::vector<SampleRule> rules(static_cast<size_t>(B), SampleRule{});
      const std::vector<int64_t> draws(static_cast<size_t>(B), 0);
      std::vector<float> rows(static_cast<size_t>(B * V));
      SampleScratch scratch;
      Clock::time_point t1{};
      for (int64_t i = 0; i < n_decode; ++i) {
        const auto t = Clock::now();
        if (host_draw) {
          model.forward_batch(tokens, states, rows);
          for (int64_t b = 0; b < B; ++b)
            next[static_cast<size_t>(b)] = sample_row(
                std::span<const float>(rows).subspan(static_cast<size_t>(b * V), static_cast<size_t>(V)), SampleRule{},
                0.0, scratch);
        } else {
          model.forward_batch_sample(tokens, states, rules, V, draws, next);
        }
        tokens = next;
        if (i == 0) {
          if (!host_draw) first_ms = 1e3 * seconds_since(t);
          t1 = Clock::now();
        }
      }
      const double s = seconds_since(t1);
      tps[host_draw] = static_cast<double>(B * (n_decode - 1)) / s;
      step_ms[host_draw] = 1e3 * s / static_cast<double>(n_decode - 1);
    }
    std::printf("| %lld | %.1f | %.3f | %.1f | %.1f | %.3f |\n", static_cast<long long>(B), tps[0], step_ms[0],
                first_ms, tps[1], step_ms[1]);
  }
}

int run_model(const std::string& dir, int64_t n_prefill, int64_t n_decode, int reps, double copy_bw,
              const std::vector<int64_t>& batches, std::optional<DType> kv_cache_opt, const std::string& replay_trace,
              ReplayMapping replay_map) {
  auto gpu = make_cuda_backend(0);
  const DType kv_cache = kv_cache_opt.value_or(gpu->auto_kv_dtype());  // as sluice's --kv-cache auto
  gpu->set_kv_dtype(kv_cache);
  auto t_load = Clock::now();
  LoadedModel m = load_model(dir, *gpu);
  const double load_s = seconds_since(t_load);
  const ModelInfo& info = m.model->info();
  if (!replay_trace.empty()) {
    const ReplayShape shape{static_cast<int64_t>(info.moe_layers.size()), info.n_expert, info.n_expert_used};
    auto replay = std::make_shared<RoutingReplay>(map_routing_trace(
        read_trace(replay_trace), std::filesystem::path(replay_trace).filename().string(), shape, replay_map));
    m.model->set_routing_replay(replay);
    std::printf("%s; decode steps run eagerly (a replay is never a captured graph)\n\n", replay->label().c_str());
  }
  const auto& cfg = m.config.contains("text_config") ? m.config["text_config"] : m.config;
  std::vector<int32_t> prompt(n_prefill);
  for (int64_t i = 0; i < n_prefill; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % info.n_vocab);
  GenerateOptions opt;
  opt.n_predict = n_decode;
  opt.sampling.temperature = 0;
  opt.prefill_chunk = n_prefill;
  std::vector<double> prefill, decode, steady, first_step_ms;
  for (int r = 0; r < reps + 1; ++r) {  // the first repetition warms the allocator and caches
    // Token arrival times: the first decode step of a sequence also captures its graph, so it
    // is reported apart from the steady state (tokens 2..n).
    std::vector<Clock::time_point> at;
    GenerateStats st = Generator(*m.model).generate(prompt, opt, [&](int32_t) {
      at.push_back(Clock::now());
      return true;
    });
    if (r == 0) continue;
    prefill.push_back(st.prefill_tokens_per_second());
    decode.push_back(st.decode_tokens_per_second());
    if (at.size() >= 3) {
      first_step_ms.push_back(1e3 * std::chrono::duration<double>(at[1] - at[0]).count());
      steady.push_back(static_cast<double>(at.size() - 2) / std::chrono::duration<double>(at.back() - at[1]).count());
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / v.size();
  };
  auto spread = [&](const std::vector<double>& v) {
    const double m0 = mean(v);
    double s = 0;
    for (double x : v) s += (x - m0) * (x - m0);
    return v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0.0;
  };
  // Bytes one decode step touches (dense weights at 2 bytes: the packs' bf16 dense precision).
  const double d = info.n_embd, L = info.n_layer, V = info.n_vocab;
  const double hd = cfg.value("head_dim", d / cfg.value("num_attention_heads", 1));
  const double nh = cfg.value("num_attention_heads", 0), nkv = cfg.value("num_key_value_heads", nh);
  const double ff = cfg.value("moe_intermediate_size", cfg.value("intermediate_size", 0));
  const double E = static_cast<double>(info.n_expert), k = static_cast<double>(info.n_expert_used);
  const double moe_layers = static_cast<double>(info.moe_layers.size());
  const DType kind = m.expert_kind.value_or(DType::bf16);
  const double b_experts = moe_layers * k * 3 * ff * d * expert_bytes_per_weight(kind, static_cast<int64_t>(d));
  const double b_attn = L * (2 * nh * hd * d + 2 * nkv * hd * d) * 2;
  const double b_router = moe_layers * E * d * 2;
  const double b_head = V * d * 2;
  const double ctx_mid = n_prefill + n_decode / 2.0;  // mean context over the decode steps
  const double b_kv = L * 2 * ctx_mid * nkv * hd * static_cast<double>(dtype_size(kv_cache));  // K and V
  const double step = b_experts + b_attn + b_router + b_head + b_kv;
  const double tps = mean(decode);
  std::printf("model %s (%s, %s experts, %s KV cache), loaded in %.1f s; device copy bandwidth %.0f GB/s\n\n",
              dir.c_str(), info.family.c_str(), std::string(expert_kind_name(kind)).c_str(),
              std::string(dtype_name(kv_cache)).c_str(), load_s, copy_bw / 1e9);
  std::printf("| bytes per decode step | MB |\n|---|---|\n");
  std::printf("| active experts (%g of %g x %g layers) | %.1f |\n", k, E, moe_layers, b_experts / 1e6);
  std::printf("| attention q/k/v/o (bf16) | %.1f |\n| router (bf16) | %.1f |\n| lm head (bf16) | %.1f |\n",
              b_attn / 1e6, b_router / 1e6, b_head / 1e6);
  std::printf("| KV cache read (%s, mean context %.0f) | %.1f |\n| total | %.1f |\n\n",
              std::string(dtype_name(kv_cache)).c_str(), ctx_mid, b_kv / 1e6,
              step / 1e6);
  const double tps_steady = steady.empty() ? 0 : mean(steady);
  std::printf("| prompt | prefill tok/s | decode tok/s (batch 1) | ms / token | decode GB/s | of roofline |"
              " first decode step ms (graph capture) | steady decode tok/s (tokens 2..n) | steady of roofline |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %lld | %.0f ± %.0f | %.1f ± %.1f | %.2f | %.0f | %.1f%% | %.1f | %.1f | %.1f%% |\n",
              static_cast<long long>(n_prefill), mean(prefill), spread(prefill), tps, spread(decode), 1e3 / tps,
              tps * step / 1e9, 100.0 * tps * step / copy_bw, first_step_ms.empty() ? 0 : mean(first_step_ms),
              tps_steady, 100.0 * tps_steady * step / copy_bw);
  if (!batches.empty()) run_batch(*m.model, prompt, n_decode, batches);
  return 0;
}

}  // namespace

constexpr const char* kUsage =
    "usage: bench_cuda --matvec | --attention | --attention-decode | --moe | --read-wave | --model PACK [--prefill N] "
    "[--decode N] [--reps R] [--kv-cache bf16|f32 (default bf16)] [--batch B,B..] [--replay-routing TRACE "
    "[--replay-map auto|ids|fit]]\n";

int main(int argc, char** argv) {
#ifndef SLUICE_HAVE_CUDA
  std::fprintf(stderr, "bench_cuda: this build has no CUDA\n");
  return 1;
#else
  std::string model;
  bool matvec = false, attention = false, attention_decode = false, moe = false, read_wave = false;
  int64_t n_prefill = 512, n_decode = 64;
  int reps = 3;
  std::optional<DType> kv_cache;  // unset: the backend's auto_kv_dtype
  std::vector<int64_t> batches;
  std::string replay_trace;
  ReplayMapping replay_map = ReplayMapping::automatic;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--matvec") matvec = true;
    else if (a == "--attention") attention = true;
    else if (a == "--attention-decode") attention_decode = true;
    else if (a == "--moe") moe = true;
    else if (a == "--read-wave") read_wave = true;
    else if (a == "--model") model = next();
    else if (a == "--replay-routing") replay_trace = next();
    else if (a == "--replay-map") {
      const std::string name = next();
      const std::optional<ReplayMapping> mapping = replay_mapping_from_name(name);
      if (!mapping) {
        std::fprintf(stderr, "bench_cuda: --replay-map takes auto, ids or fit, not '%s'\n", name.c_str());
        return 2;
      }
      replay_map = *mapping;
    }
    else if (a == "--prefill") n_prefill = std::atoll(next().c_str());
    else if (a == "--decode") n_decode = std::atoll(next().c_str());
    else if (a == "--reps") reps = std::atoi(next().c_str());
    else if (a == "--kv-cache") {
      const std::string name = next();
      kv_cache = dtype_from_name(name);
      if (kv_cache != DType::f32 && kv_cache != DType::bf16) {
        std::fprintf(stderr, "bench_cuda: --kv-cache takes f32 or bf16, not '%s'\n", name.c_str());
        return 2;
      }
    }
    else if (a == "--batch") {
      const std::string list = next();
      for (size_t at = 0; at < list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const long long b = std::atoll(list.substr(at, comma - at).c_str());
        if (b < 1 || b > 64) {
          std::fprintf(stderr, "bench_cuda: --batch takes sizes from 1 to 64, not '%s'\n", list.c_str());
          return 2;
        }
        batches.push_back(b);
        at = comma + 1;
      }
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }
  try {
    const double bw = copy_bandwidth();
    if (matvec) run_matvec(bw);
    if (attention) run_attention();
    if (attention_decode) run_attention_decode(bw);
    if (moe) run_moe(bw);
    if (read_wave) bench::run_read_wave(bw);
    if (!replay_trace.empty() && model.empty()) {
      std::fprintf(stderr, "bench_cuda: --replay-routing needs --model PACK\n");
      return 2;
    }
    if (!model.empty()) run_model(model, n_prefill, n_decode, reps, bw, batches, kv_cache, replay_trace, replay_map);
    if (!matvec && !attention && !attention_decode && !moe && !read_wave && model.empty()) {
      std::fputs(kUsage, stderr);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
#endif
}
