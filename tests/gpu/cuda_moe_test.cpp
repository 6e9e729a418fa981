// Device MoE kernels (backends/cuda/moe_kernels.h) against the CPU reference:
//   - router top-k: ids identical to route_topk, weights within 1e-6 (relative);
//   - routed experts through an ExpertRef table for f32/bf16/q8/q4/q2 weights, sizes where the
//     16-byte vector path applies and odd ones where it does not: 8 experts with 2 used, an
//     expert nobody routes to, every token routed to one expert; within 1e-6 normalized
//     squared error of routed_experts (the GPU dequantizes exactly as the CPU: only the
//     summation order differs);
//   - two-phase dispatch: unavailable experts are skipped and their pairs left not done, the
//     combine counts them as zero, the second phase fills exactly the rest (a done pair is
//     never recomputed), and the result then equals the one-phase result;
//   - the decode kernels (moe_decode.cu) against the CPU and, bit for bit, the generic
//     kernels, at 1, 2 and 8 rows, in one phase, two phases and the fused launch.
// Sentinels after every device output catch out-of-bounds writes.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/moe_kernels.h"
#include "core/quant.h"
#include "models/blocks.h"
#include "tests/gpu/scoped_env.h"

using namespace sluice;

namespace {

constexpr double kMaxNse = 1e-6;
constexpr float kSentinel = 1234.5f;
constexpr int64_t kGuard = 64;

std::vector<float> random_vec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A weight matrix [rows, cols] in host memory in the given dtype (quantized with
// quantize_row for q8/q4/q2).
struct HostWeight {
  std::vector<uint8_t> data, scales;
  Tensor t;
  HostWeight(DType dt, int64_t rows, int64_t cols, uint32_t seed) {
    auto v = random_vec(rows * cols, seed, 0.5f);
    t = Tensor(dt, {rows, cols}, nullptr);
    if (dtype_is_quantized(dt)) {
      const int64_t rb = quant_row_bytes(dt, cols), sb = quant_scale_row_bytes(dt, cols);
      data.resize(rows * rb);
      scales.resize(rows * sb);
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_TRUE(quantize_row(dt, v.data() + r * cols, cols, data.data() + r * rb, scales.data() + r * sb));
      t.data = data.data();
      t.scales = scales.data();
    } else {
      data.resize(t.nbytes());
      for (int64_t i = 0; i < rows * cols; ++i) {
        if (dt == DType::f32) std::memcpy(data.data() + 4 * i, &v[i], 4);
        else {
          uint16_t h = dt == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
          std::memcpy(data.data() + 2 * i, &h, 2);
        }
      }
      t.data = data.data();
    }
  }
};

cuda::WType wtype_code(DType dt) {
  switch (dt) {
    case DType::f32: return cuda::WType::f32;
    case DType::f16: return cuda::WType::f16;
    case DType::bf16: return cuda::WType::bf16;
    case DType::q8: return cuda::WType::q8;
    case DType::q4: return cuda::WType::q4;
    case DType::q2: return cuda::WType::q2;
    case DType::mxfp4: return cuda::WType::mxfp4;
    default: return cuda::WType::unavailable;
  }
}

// Raw device buffers (the kernels take plain pointers), freed at the end of the test.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  T* put(const std::vector<T>& host, size_t guard_elems = 0, T guard_value = T{}) {
    std::vector<T> v(host);
    v.resize(host.size() + guard_elems, guard_value);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T) + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    ptrs.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> get(const T* p, size_t n) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

void expect_close(const std::vector<float>& got_with_guard, const std::vector<float>& want, const std::string& what) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got_with_guard[i]) - want[i]) * (double(got_with_guard[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  EXPECT_LE(num / std::max(den, 1e-30), kMaxNse) << what;
  for (size_t i = want.size(); i < got_with_guard.size(); ++i)
    ASSERT_EQ(got_with_guard[i], kSentinel) << what << ": write past the end at +" << i - want.size();
}

TEST(CudaMoe, RouterTopkMatchesRouteTopk) {
  struct Case {
    int64_t n, E, k;
    bool norm;
    bool ties;
  };
  for (Case c : {Case{7, 8, 2, true, false}, {7, 8, 2, false, false}, {1, 128, 8, true, false},
                 {33, 128, 8, false, false}, {5, 60, 4, true, false}, {3, 512, 10, true, false},
                 {6, 16, 3, true, true}, {4, 256, 8, true, true}, {3, 200, 32, true, false},
                 // the shared-memory kernel: more than 512 experts, or more than 32 a token
                 {3, 600, 6, true, false}, {2, 64, 40, false, true}}) {
    auto logits = random_vec(c.n * c.E, 31 + static_cast<uint32_t>(c.E), 2.0f);
    if (c.ties)  // equal logits: the lower expert id ranks first
      for (int64_t i = 0; i < c.n * c.E; ++i) logits[i] = std::round(logits[i]);
    RouterSpec spec{c.E, c.k, c.norm};
    Routing want = route_topk(spec, logits, c.n);
    // Gemma 4's per-expert scales (in both kernels: the register top-k's widths and the
    // shared-memory one): each weight times its expert's scale after the renormalization.
    const std::vector<float> scale = random_vec(c.E, 37 + static_cast<uint32_t>(c.E), 1.0f);
    for (bool scaled : {false, true}) {
      DeviceBuffers d;
      const float* dl = d.put(logits);
      const float* dscale = scaled ? d.put(scale) : nullptr;
      int32_t* ids = d.put(std::vector<int32_t>(c.n * c.k, -7), kGuard, int32_t{-9});
      float* w = d.put(std::vector<float>(c.n * c.k, 0.0f), kGuard, kSentinel);
      cuda::launch_router_topk(dl, c.n, c.E, c.k, c.norm, ids, w, nullptr, dscale);
      auto got_ids = d.get(ids, c.n * c.k + kGuard);
      auto got_w = d.get(w, c.n * c.k + kGuard);
      const std::string what = "router n=" + std::to_string(c.n) + " E=" + std::to_string(c.E) + " k=" +
                               std::to_string(c.k) + (c.norm ? " norm" : "") + (c.ties ? " ties" : "") +
                               (scaled ? " scaled" : "");
      for (int64_t i = 0; i < c.n * c.k; ++i) {
        ASSERT_EQ(got_ids[i], want.ids[i]) << what << " pair " << i;
        const float want_w = scaled ? want.weights[i] * scale[static_cast<size_t>(want.ids[i])] : want.weights[i];
        EXPECT_NEAR(got_w[i], want_w, 1e-6 * std::max(1.0f, std::abs(want_w))) << what << " pair " << i;
      }
      for (int64_t i = c.n * c.k; i < c.n * c.k + kGuard; ++i) {
        ASSERT_EQ(got_ids[i], -9) << what << ": ids written past the end";
        ASSERT_EQ(got_w[i], kSentinel) << what << ": weights written past the end";
      }
    }
  }
}

// The sigmoid scoring (Llama 4): the k largest logits (ties: the lower id), weights their
// sigmoids; ids identical to route_topk's, weights within 1e-6, nothing written past the end.
TEST(CudaMoe, RouterTopkSigmoidMatchesRouteTopk) {
  struct Case {
    int64_t n, E, k;
    bool ties;
  };
  for (Case c : {Case{7, 16, 1, false}, {5, 16, 2, false}, {9, 128, 1, true}, {3, 200, 8, false}, {4, 512, 32, true},
                 {6, 8, 8, true}}) {
    auto logits = random_vec(c.n * c.E, 61 + static_cast<uint32_t>(c.E), 2.0f);
    if (c.ties)
      for (int64_t i = 0; i < c.n * c.E; ++i) logits[i] = std::round(logits[i]);
    Routing want = route_topk(RouterSpec{c.E, c.k, false, RouterScoring::sigmoid}, logits, c.n);
    DeviceBuffers d;
    const float* dl = d.put(logits);
    int32_t* ids = d.put(std::vector<int32_t>(c.n * c.k, -7), kGuard, int32_t{-9});
    float* w = d.put(std::vector<float>(c.n * c.k, 0.0f), kGuard, kSentinel);
    cuda::launch_router_topk_sigmoid(dl, c.n, c.E, c.k, ids, w, nullptr);
    auto got_ids = d.get(ids, c.n * c.k + kGuard);
    auto got_w = d.get(w, c.n * c.k + kGuard);
    const std::string what = "sigmoid router n=" + std::to_string(c.n) + " E=" + std::to_string(c.E) +
                             " k=" + std::to_string(c.k) + (c.ties ? " ties" : "");
    for (int64_t i = 0; i < c.n * c.k; ++i) {
      ASSERT_EQ(got_ids[i], want.ids[i]) << what << " pair " << i;
      EXPECT_NEAR(got_w[i], want.weights[i], 1e-6) << what << " pair " << i;
    }
    for (int64_t i = c.n * c.k; i < c.n * c.k + kGuard; ++i) {
      ASSERT_EQ(got_ids[i], -9) << what << ": ids written past the end";
      ASSERT_EQ(got_w[i], kSentinel) << what << ": weights written past the end";
    }
  }
}

// A layer of E experts of one dtype, on both sides: host tensors for the CPU reference and
// device copies referenced by an ExpertRef table with math's activation. With the clamped
// SwiGLU (gpt-oss), every expert also has random f32 biases on its three products.
struct ExpertLayer {
  std::vector<HostWeight> gate, up, down;
  std::vector<std::vector<float>> bias_values;  // [E * 3]: gate, up, down
  std::vector<ExpertWeights> host;
  std::vector<ExpertWeights> device;
  std::vector<cuda::ExpertRef> table;
  ExpertLayer(Backend& gpu, DType dt, int64_t E, int64_t n_embd, int64_t n_ff, const ExpertMath& math = {}) {
    const bool biased = math.activation == ExpertActivation::swiglu_clamped;
    gate.reserve(E);
    up.reserve(E);
    down.reserve(E);
    bias_values.reserve(3 * E);
    for (int64_t e = 0; e < E; ++e) {
      gate.emplace_back(dt, n_ff, n_embd, 100 + 3 * static_cast<uint32_t>(e));
      up.emplace_back(dt, n_ff, n_embd, 101 + 3 * static_cast<uint32_t>(e));
      down.emplace_back(dt, n_embd, n_ff, 102 + 3 * static_cast<uint32_t>(e));
    }
    for (int64_t e = 0; e < E; ++e) {
      ExpertWeights hw;
      hw.gate = gate[e].t, hw.up = up[e].t, hw.down = down[e].t;
      host.push_back(hw);
      ExpertWeights dw;
      dw.gate = gpu.upload(gate[e].t), dw.up = gpu.upload(up[e].t), dw.down = gpu.upload(down[e].t);
      cuda::ExpertRef ref;
      ref.data[0] = dw.gate.data, ref.data[1] = dw.up.data, ref.data[2] = dw.down.data;
      ref.scales[0] = dw.gate.scales, ref.scales[1] = dw.up.scales, ref.scales[2] = dw.down.scales;
      ref.wtype = wtype_code(dt);
      if (biased) {
        const int64_t len[3] = {n_ff, n_ff, n_embd};
        Tensor* hb[3] = {&host.back().gate_bias, &host.back().up_bias, &host.back().down_bias};
        Tensor* db[3] = {&dw.gate_bias, &dw.up_bias, &dw.down_bias};
        for (int m = 0; m < 3; ++m) {
          bias_values.push_back(random_vec(len[m], 300 + 3 * static_cast<uint32_t>(e) + m, 2.0f));
          *hb[m] = Tensor(DType::f32, {len[m]}, bias_values.back().data());
          *db[m] = gpu.upload(*hb[m]);
          ref.bias[m] = static_cast<const float*>(db[m]->data);
        }
      }
      ref.act = cuda::expert_act_of(math);
      ref.alpha = math.alpha;
      ref.limit = math.limit;
      table.push_back(ref);
      device.push_back(std::move(dw));
    }
  }
};

// out = the CPU routed experts (the reference).
std::vector<float> cpu_routed(const ExpertLayer& layer, const Routing& routing, const std::vector<float>& hv,
                              int64_t n_embd, const ExpertMath& math = {}) {
  auto cpu = make_cpu_backend();
  Tensor h = cpu->alloc(DType::f32, {routing.n_rows, n_embd});
  cpu->from_host(h, hv.data());
  Tensor out = cpu->alloc(DType::f32, {routing.n_rows, n_embd});
  routed_experts(*cpu, math, routing, h, out, [&](int32_t e) -> const ExpertWeights& { return layer.host[e]; });
  std::vector<float> v(out.numel());
  cpu->to_host(out, v.data());
  return v;
}

Routing make_routing(int64_t n, int64_t E, int64_t k, uint32_t seed, int32_t never, int32_t always) {
  std::mt19937 rng(seed);
  Routing r;
  r.n_rows = n;
  r.k = k;
  for (int64_t row = 0; row < n; ++row) {
    std::vector<int32_t> pool;
    for (int32_t e = 0; e < E; ++e)
      if (e != never && e != always) pool.push_back(e);
    std::shuffle(pool.begin(), pool.end(), rng);
    if (always >= 0) pool.insert(pool.begin() + static_cast<int64_t>(row % k), always);
    float sum = 0;
    std::vector<float> w(k);
    for (int64_t j = 0; j < k; ++j) sum += w[j] = std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
    for (int64_t j = 0; j < k; ++j) {
      r.ids.push_back(pool[j]);
      r.weights.push_back(w[j] / sum);
    }
  }
  return r;
}

struct GpuRun {
  std::vector<float> out;          // [n, n_embd] + guard
  std::vector<uint8_t> done;       // [n * k]
};

// Runs the phases over tables (each a per-expert availability mask over layer.table, with
// optional replacement weights) and then the combine.
GpuRun gpu_routed(const ExpertLayer& layer, const Routing& routing, const std::vector<float>& hv, int64_t n_embd,
                  int64_t n_ff, const std::vector<std::vector<cuda::ExpertRef>>& phases,
                  cuda::WType wtype = cuda::WType::unavailable, bool combine_by_table = false,
                  const cuda::CopyList& copies = {}) {
  const int64_t n = routing.n_rows, k = routing.k, pairs = n * k;
  DeviceBuffers d;
  const float* h = d.put(hv);
  const int32_t* ids = d.put(routing.ids);
  const float* w = d.put(routing.weights);
  uint8_t* done = d.put(std::vector<uint8_t>(pairs, 0), kGuard, uint8_t{77});
  float* act = d.put(std::vector<float>(pairs * n_ff, 0.0f), kGuard, kSentinel);
  float* pair_out = d.put(std::vector<float>(pairs * n_embd, 0.0f), kGuard, kSentinel);
  float* out = d.put(std::vector<float>(n * n_embd, 0.0f), kGuard, kSentinel);
  cuda::MoeShape shape{n, k, n_embd, n_ff, static_cast<int64_t>(layer.table.size()), wtype};
  const cuda::ExpertRef* t = nullptr;
  for (const auto& table : phases) {
    t = d.put(table);
    cuda::launch_moe_experts(h, ids, t, done, act, pair_out, shape, nullptr, true,
                             &table == &phases.front() ? copies : cuda::CopyList{});
  }
  if (combine_by_table) cuda::launch_moe_combine_done(pair_out, w, nullptr, out, shape, nullptr, ids, t);
  else cuda::launch_moe_combine_done(pair_out, w, done, out, shape, nullptr);
  GpuRun r;
  r.out = d.get(out, n * n_embd + kGuard);
  r.done = d.get(done, pairs + kGuard);
  auto act_h = d.get(act, pairs * n_ff + kGuard);
  auto po_h = d.get(pair_out, pairs * n_embd + kGuard);
  for (int64_t i = 0; i < kGuard; ++i) {
    EXPECT_EQ(r.done[pairs + i], 77) << "done written past the end";
    EXPECT_EQ(act_h[pairs * n_ff + i], kSentinel) << "act written past the end";
    EXPECT_EQ(po_h[pairs * n_embd + i], kSentinel) << "pair_out written past the end";
  }
  return r;
}

// The fully resident launch (launch_moe_experts_combine: no done flags, down and combine
// fused): out [n, n_embd] + guard. one_down: the CUDA streamer's decode layer as one phase
// instead (launch_moe_gate_up, then launch_moe_down_combine_table: the down + combine that
// waits for the gate/up product at its entry, where the resident launch reads its experts
// first).
std::vector<float> gpu_fused(const std::vector<cuda::ExpertRef>& table, const Routing& routing,
                             const std::vector<float>& hv, int64_t n_embd, int64_t n_ff,
                             cuda::WType wtype = cuda::WType::unavailable, bool one_down = false) {
  const int64_t n = routing.n_rows, k = routing.k;
  DeviceBuffers d;
  const float* h = d.put(hv);
  const int32_t* ids = d.put(routing.ids);
  const float* w = d.put(routing.weights);
  const cuda::ExpertRef* t = d.put(table);
  float* act = d.put(std::vector<float>(n * k * n_ff, 0.0f), kGuard, kSentinel);
  float* out = d.put(std::vector<float>(n * n_embd, 0.0f), kGuard, kSentinel);
  const cuda::MoeShape shape{n, k, n_embd, n_ff, static_cast<int64_t>(table.size()), wtype};
  if (one_down) {
    float* pair_out = d.put(std::vector<float>(n * k * n_embd, 0.0f), kGuard, kSentinel);
    cuda::launch_moe_gate_up(h, ids, t, nullptr, act, shape, nullptr);
    cuda::launch_moe_down_combine_table(ids, w, t, act, pair_out, out, shape, nullptr);
  } else {
    cuda::launch_moe_experts_combine(h, ids, w, t, act, out, shape, nullptr);
  }
  auto got = d.get(out, n * n_embd + kGuard);
  auto act_h = d.get(act, n * k * n_ff + kGuard);
  for (int64_t i = 0; i < kGuard; ++i) {
    EXPECT_EQ(got[n * n_embd + i], kSentinel) << "fused: out written past the end";
    EXPECT_EQ(act_h[n * k * n_ff + i], kSentinel) << "fused: act written past the end";
  }
  return got;
}

struct Shape {
  int64_t n, E, k, n_embd, n_ff;
};

TEST(CudaMoe, ExpertsMatchRoutedExperts) {
  // 256 x 192: every type takes the 16-byte path; 100 x 40 and 70 x 33: none does (partial
  // quantized groups, unaligned rows).
  for (DType dt : {DType::f32, DType::bf16, DType::q8, DType::q4, DType::q2})
    for (Shape s : {Shape{9, 8, 2, 256, 192}, {5, 8, 2, 100, 40}, {3, 6, 3, 70, 33}, {1, 8, 2, 256, 192}}) {
      auto gpu = make_cuda_backend(0);
      ExpertLayer layer(*gpu, dt, s.E, s.n_embd, s.n_ff);
      auto hv = random_vec(s.n * s.n_embd, 7);
      struct R {
        const char* name;
        Routing routing;
      };
      for (const R& r : {R{"random, expert 3 unused", make_routing(s.n, s.E, s.k, 5, 3, -1)},
                         R{"every row to expert 5", make_routing(s.n, s.E, s.k, 6, -1, 5)},
                         R{"k=1 every row to expert 2", make_routing(s.n, s.E, 1, 8, -1, 2)}}) {
        const std::string what = std::string(dtype_name(dt)) + " " + r.name + " n=" + std::to_string(s.n) +
                                 " embd=" + std::to_string(s.n_embd) + " ff=" + std::to_string(s.n_ff);
        auto want = cpu_routed(layer, r.routing, hv, s.n_embd);
        GpuRun got = gpu_routed(layer, r.routing, hv, s.n_embd, s.n_ff, {layer.table});
        expect_close(got.out, want, what);
        for (int64_t p = 0; p < r.routing.n_rows * r.routing.k; ++p) ASSERT_EQ(got.done[p], 1) << what;
        // Compiled for the one weight type (MoeShape::wtype): the same sums, bit for bit.
        GpuRun typed = gpu_routed(layer, r.routing, hv, s.n_embd, s.n_ff, {layer.table}, layer.table[0].wtype);
        EXPECT_EQ(typed.out, got.out) << what << " (typed kernels)";
      }
    }
}

TEST(CudaMoe, TwoPhaseDispatch) {
  for (DType dt : {DType::bf16, DType::q4}) {
    const Shape s{11, 8, 2, 256, 192};
    auto gpu = make_cuda_backend(0);
    ExpertLayer layer(*gpu, dt, s.E, s.n_embd, s.n_ff);
    auto hv = random_vec(s.n * s.n_embd, 9);
    Routing routing = make_routing(s.n, s.E, s.k, 12, -1, -1);
    auto unavailable = [](int32_t e) { return e % 3 == 1; };  // experts 1, 4, 7 miss in phase 1
    std::vector<cuda::ExpertRef> phase1 = layer.table, phase2 = layer.table;
    for (int32_t e = 0; e < s.E; ++e) {
      if (unavailable(e)) phase1[e].wtype = cuda::WType::unavailable;
      // Phase 2 gives the phase-1 experts another expert's weights: a done pair that were
      // computed again would change the result.
      else phase2[e] = layer.table[(e + 1) % s.E];
    }
    // Phase 1 alone: the missed pairs are not done and count as zero (a cut).
    Routing cut = routing;
    for (size_t p = 0; p < cut.ids.size(); ++p)
      if (unavailable(cut.ids[p])) cut.weights[p] = 0.0f;
    GpuRun one = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {phase1});
    expect_close(one.out, cpu_routed(layer, cut, hv, s.n_embd), std::string(dtype_name(dt)) + " phase 1 only");
    for (size_t p = 0; p < routing.ids.size(); ++p)
      ASSERT_EQ(one.done[p], unavailable(routing.ids[p]) ? 0 : 1) << "done after phase 1, pair " << p;
    // Both phases: every pair done, the full result.
    GpuRun both = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {phase1, phase2});
    expect_close(both.out, cpu_routed(layer, routing, hv, s.n_embd), std::string(dtype_name(dt)) + " two phases");
    for (size_t p = 0; p < routing.ids.size(); ++p) ASSERT_EQ(both.done[p], 1) << "done after phase 2, pair " << p;
    // The combine counting the pairs whose entry the last table holds (no done flags read:
    // the CUDA streamer's) gives the same bits, after one phase (the misses cut) and two.
    for (int phases = 1; phases <= 2; ++phases) {
      std::vector<std::vector<cuda::ExpertRef>> tables{phase1};
      if (phases == 2) tables.push_back(phase2);
      GpuRun by_table = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, tables, cuda::WType::unavailable, true);
      const GpuRun& want = phases == 1 ? one : both;
      for (int64_t i = 0; i < s.n * s.n_embd; ++i)
        ASSERT_EQ(by_table.out[i], want.out[i]) << phases << " phase(s), combined by the table, element " << i;
    }
    // One phase with the full table gives the same bits as two (a pair depends only on its
    // row and its expert).
    GpuRun single = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {layer.table});
    for (int64_t i = 0; i < s.n * s.n_embd; ++i) ASSERT_EQ(single.out[i], both.out[i]) << "element " << i;
    // The fully resident launch (no done flags, down and combine fused) gives the same bits.
    auto fused = gpu_fused(layer.table, routing, hv, s.n_embd, s.n_ff);
    for (int64_t i = 0; i < s.n * s.n_embd; ++i) ASSERT_EQ(fused[i], both.out[i]) << "fused, element " << i;
  }
}

// SLUICE_CUDA_MOE_DECODE=0 (the generic expert kernels) for a scope; the launchers read it at
// every launch.
struct GenericMoeKernels : ScopedEnv {
  GenericMoeKernels() : ScopedEnv("SLUICE_CUDA_MOE_DECODE", "0") {}
};

// The table with every expert's weights copied 4 bytes past a 16-byte boundary (scales as
// they are): the decode kernels' scalar path.
std::vector<cuda::ExpertRef> misaligned_table(const ExpertLayer& layer, DeviceBuffers& d) {
  std::vector<cuda::ExpertRef> table = layer.table;
  for (size_t e = 0; e < table.size(); ++e)
    for (int m = 0; m < 3; ++m) {
      const HostWeight& w = (m == 0 ? layer.gate : m == 1 ? layer.up : layer.down)[e];
      std::vector<uint8_t> bytes(4 + w.data.size());
      std::memcpy(bytes.data() + 4, w.data.data(), w.data.size());
      table[e].data[m] = d.put(bytes) + 4;
    }
  return table;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, int64_t count,
                      const std::string& what) {
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], want[i]) << what << ", element " << i;
}

// One layer's kernels at n rows (hv and the routing drawn from `seed`; expert 3 unused) with
// the layer's math: the one-phase result within the bound of the CPU's; two phases (experts
// 1, 4, 7, ... unavailable in the first, the second giving the others another expert's
// weights, which a done pair computed again would show) the same bits; the fused resident
// launch and the CUDA streamer's one down + combine the same bits; and both again on the
// generic kernels (SLUICE_CUDA_MOE_DECODE=0).
void expect_every_launch_agrees(const ExpertLayer& layer, const Shape& s, cuda::WType wt, int64_t n, uint32_t seed,
                                const ExpertMath& math, const std::string& what) {
  std::vector<cuda::ExpertRef> phase1 = layer.table, phase2 = layer.table;
  for (int32_t e = 0; e < s.E; ++e) {
    if (e % 3 == 1) phase1[e].wtype = cuda::WType::unavailable;
    else phase2[e] = layer.table[(e + 1) % s.E];
  }
  auto hv = random_vec(n * s.n_embd, seed);
  Routing routing = make_routing(n, s.E, s.k, seed + 2, 3, -1);
  const std::vector<float> want = cpu_routed(layer, routing, hv, s.n_embd, math);
  GpuRun one = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {layer.table}, wt);
  expect_close(one.out, want, what);
  GpuRun two = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {phase1, phase2}, wt);
  for (int64_t p = 0; p < n * s.k; ++p) ASSERT_EQ(two.done[p], 1) << what << " two phases, pair " << p;
  expect_same_bits(two.out, one.out, n * s.n_embd, what + " two phases");
  expect_same_bits(gpu_fused(layer.table, routing, hv, s.n_embd, s.n_ff, wt), one.out, n * s.n_embd, what + " fused");
  expect_same_bits(gpu_fused(layer.table, routing, hv, s.n_embd, s.n_ff, wt, /*one_down=*/true), one.out,
                   n * s.n_embd, what + " one down + combine (not early)");
  GenericMoeKernels generic;
  expect_same_bits(gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {layer.table}, wt).out, one.out, n * s.n_embd,
                   what + " generic kernels");
  expect_same_bits(gpu_fused(layer.table, routing, hv, s.n_embd, s.n_ff, wt), one.out, n * s.n_embd,
                   what + " generic fused");
  // Compiled for any type (the mixed-table kernels): within the bound too.
  expect_close(gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {layer.table}).out, want, what + " mixed");
}

// The decode kernels (moe_decode.cu; bf16, q8 and q4 at sizes of whole 16-byte chunks) for
// every weight type at 1, 2 and 8 rows: within the tolerance of the CPU reference; two phases
// (experts 1, 4, 7, ... unavailable in the first) give the same bits as one, and so does the
// fused resident launch; and all of it the same bits as the generic kernels of moe_kernels.cu
// (compiled for the one type, as the decode kernels are). 2048 x 768: the model's shape.
TEST(CudaMoe, DecodeKernelsMatchGenericAndCpu) {
  struct Case {
    Shape s;  // s.n unused: 1, 2 and 8 rows
    std::vector<DType> types;
  };
  // 2080 x 1056, top-10 of 12: lanes with chunks past the first group in both products, a
  // down tile past n_embd, and fused-combine warps with two (rank, rows) items each (top-10
  // is the most whose act rows fit the staged 48 KiB). 256 x 200, top-2 of 8: every type;
  // bf16 with a gate/up tile past n_ff, the others on the generic kernels (200 is not whole
  // int8 or q4 chunks).
  for (const Case& c : {Case{{0, 12, 10, 2080, 1056}, {DType::bf16, DType::q8, DType::q4}},
                        Case{{0, 8, 4, 2048, 768}, {DType::q4}},
                        Case{{0, 8, 2, 256, 200}, {DType::f32, DType::f16, DType::bf16, DType::q8, DType::q4, DType::q2}}}) {
    const Shape& s = c.s;
    for (DType dt : c.types) {
      auto gpu = make_cuda_backend(0);
      ExpertLayer layer(*gpu, dt, s.E, s.n_embd, s.n_ff);
      const cuda::WType wt = layer.table[0].wtype;
      for (int64_t n : {1, 2, 8})
        expect_every_launch_agrees(layer, s, wt, n, 21 + static_cast<uint32_t>(n), ExpertMath{},
                                   str(dtype_name(dt), " n=", n, " embd=", s.n_embd, " ff=", s.n_ff, " k=", s.k));
      if (dt == DType::q4 && s.n_embd > 1024) {  // rows off 16-byte alignment: the scalar path
        DeviceBuffers d;
        const std::vector<cuda::ExpertRef> off = misaligned_table(layer, d);
        auto hv = random_vec(2 * s.n_embd, 29);
        Routing routing = make_routing(2, s.E, s.k, 31, 3, -1);
        GpuRun got = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {off}, wt);
        expect_close(got.out, cpu_routed(layer, routing, hv, s.n_embd), "q4 misaligned");
        auto fused = gpu_fused(off, routing, hv, s.n_embd, s.n_ff, wt);
        expect_same_bits(fused, got.out, 2 * s.n_embd, "q4 misaligned fused");
        GenericMoeKernels generic;
        expect_same_bits(gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {off}, wt).out, got.out, 2 * s.n_embd,
                         "q4 misaligned, generic kernels");
      }
    }
  }
}

// Copies riding with the gate/up launch (CopyList, the CUDA streamer's phase-1 copies): three
// records of odd sizes from host-mapped memory land in device memory byte for byte, and the
// product gives the same bits as without them; on the decode kernel (q4 2080 x 1056, 1 and 2
// rows) and on the generic kernels, which copy on the stream first.
TEST(CudaMoe, GateUpCarriesCopiesBesideTheProduct) {
  const Shape s{0, 12, 10, 2080, 1056};
  auto gpu = make_cuda_backend(0);
  ExpertLayer layer(*gpu, DType::q4, s.E, s.n_embd, s.n_ff);
  const cuda::WType wt = layer.table[0].wtype;
  const std::vector<uint64_t> sizes{(1u << 20) + 48, 16, 200 * 1024};
  uint64_t total = 0;
  for (uint64_t b : sizes) total += b;
  uint8_t* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocMapped), cudaSuccess);
  std::mt19937 rng(5);
  for (uint64_t i = 0; i < total; ++i) host[i] = static_cast<uint8_t>(rng());
  uint8_t* host_dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0), cudaSuccess);
  for (bool generic : {false, true}) {
    std::optional<GenericMoeKernels> on_generic;
    if (generic) on_generic.emplace();
    for (int64_t n : {1, 2}) {
      const std::string what = str(generic ? "generic" : "decode", " kernels, n=", n);
      DeviceBuffers d;
      uint8_t* dst = d.put(std::vector<uint8_t>(total, 0xab));
      std::vector<cuda::CopyDesc> descs;
      uint64_t off = 0;
      for (uint64_t b : sizes) {
        descs.push_back(cuda::CopyDesc{host_dev + off, dst + off, b});
        off += b;
      }
      const cuda::CopyList copies{d.put(descs), d.put(std::vector<uint32_t>{static_cast<uint32_t>(descs.size())})};
      auto hv = random_vec(n * s.n_embd, 41);
      Routing routing = make_routing(n, s.E, s.k, 43, -1, -1);
      GpuRun with = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {layer.table}, wt, false, copies);
      GpuRun without = gpu_routed(layer, routing, hv, s.n_embd, s.n_ff, {layer.table}, wt);
      for (int64_t i = 0; i < n * s.n_embd; ++i) ASSERT_EQ(with.out[i], without.out[i]) << what << ", element " << i;
      const std::vector<uint8_t> landed = d.get(dst, total);
      for (uint64_t i = 0; i < total; ++i) ASSERT_EQ(landed[i], host[i]) << what << ", byte " << i;
    }
  }
  cudaFreeHost(host);
}

// The families' expert math in every expert kernel: gpt-oss's
// (f32 biases on the three products, the clamped SwiGLU with gpt-oss's alpha and a limit the
// dots cross on both sides, MXFP4 weights among the types) and Gemma 4's (GeGLU): against the
// CPU's routed_experts with the same math; the decode kernels (moe_decode.cu: bf16, q8, q4,
// mxfp4 at whole 16-byte chunks) bit for bit the generic kernels, two phases the same bits as
// one, the fused resident launch the same bits; odd sizes (100 x 40) on the generic kernels'
// scalar path.
// gpt-oss's expert math with a limit that dots of ~N(0, 5) cross often, both ways; Gemma 4's.
ExpertMath clamped_math() {
  ExpertMath math;
  math.activation = ExpertActivation::swiglu_clamped;
  math.limit = 3.0f;
  return math;
}
const ExpertMath kGeglu{ExpertActivation::geglu_tanh};

TEST(CudaMoe, FamilyExpertMathEveryKernel) {
  struct Case {
    Shape s;  // s.n unused: 1, 2 and 8 rows
    std::vector<DType> types;
  };
  for (const Case& c : {Case{{0, 12, 4, 512, 384}, {DType::mxfp4, DType::bf16, DType::q8, DType::q4}},
                        Case{{0, 8, 2, 100, 40}, {DType::mxfp4, DType::bf16, DType::f32}}}) {
    for (DType dt : c.types)
      for (const ExpertMath& math : {clamped_math(), kGeglu}) {
        auto gpu = make_cuda_backend(0);
        ExpertLayer layer(*gpu, dt, c.s.E, c.s.n_embd, c.s.n_ff, math);
        const char* name = math == kGeglu ? " geglu" : " clamped, biased";
        for (int64_t n : {1, 2, 8})
          expect_every_launch_agrees(layer, c.s, layer.table[0].wtype, n, 41 + static_cast<uint32_t>(n), math,
                                     std::string(dtype_name(dt)) + name + " n=" + std::to_string(n) +
                                         " embd=" + std::to_string(c.s.n_embd) + " ff=" + std::to_string(c.s.n_ff));
      }
  }
}

}  // namespace

namespace {

// Backend::moe_routed of `table` (the layer's experts, routed as `routing` says) over s.n
// random rows and router logits against the host path with the same math: route_topk (the
// scoring; Gemma 4's scales after it) + routed_experts; out has a guard.
void expect_moe_routed_matches_host(Backend& gpu, const ExpertLayer& layer, const ExpertTable& table, const Shape& s,
                                    bool norm, const ExpertMath& math, const std::string& what,
                                    const TableRouting& table_routing = {}) {
  auto hv = random_vec(s.n * s.n_embd, 17);
  auto lv = random_vec(s.n * s.E, 18, 1.5f);
  Routing routing = route_topk(RouterSpec{s.E, s.k, norm, table_routing.scoring}, lv, s.n);
  const std::span<const float> expert_scale = table_routing.expert_scale;
  if (!expert_scale.empty())  // as Gemma 4's moe: after the renormalization
    for (size_t p = 0; p < routing.ids.size(); ++p) routing.weights[p] *= expert_scale[static_cast<size_t>(routing.ids[p])];
  const std::vector<float> want = cpu_routed(layer, routing, hv, s.n_embd, math);
  Tensor h = gpu.alloc(DType::f32, {s.n, s.n_embd}), logits = gpu.alloc(DType::f32, {s.n, s.E});
  gpu.from_host(h, hv.data());
  gpu.from_host(logits, lv.data());
  Tensor whole = gpu.alloc(DType::f32, {s.n * s.n_embd + kGuard});
  std::vector<float> init(s.n * s.n_embd + kGuard, kSentinel);
  gpu.from_host(whole, init.data());
  Tensor out(DType::f32, {s.n, s.n_embd}, whole.data);
  gpu.moe_routed(table, logits, s.k, norm, h, out);
  std::vector<float> got(init.size());
  gpu.to_host(whole, got.data());
  expect_close(got, want, what + " n=" + std::to_string(s.n) + (norm ? " norm" : ""));
}

// Backend::moe_routed (router top-k, experts and combine on the device, from router logits)
// against the host path the decoders use without a table: route_topk + routed_experts.
TEST(CudaMoe, BackendMoeRoutedMatchesHostPath) {
  for (DType dt : {DType::bf16, DType::q4, DType::q2})
    // The last three: 4+ pairs per expert, the grouped (prefill) kernels: on the tensor cores
    // in tiles of 64 pairs (300 rows) and of 32 (100 rows: fewer than 48 pairs an expert),
    // and with odd sizes on the f32 tiles.
    for (Shape s : {Shape{1, 8, 2, 256, 192}, {13, 8, 2, 256, 192}, {4, 6, 3, 70, 33}, {300, 8, 2, 256, 192},
                    {100, 8, 2, 256, 192}, {45, 6, 3, 70, 33}}) {
      auto gpu = make_cuda_backend(0);
      ExpertLayer layer(*gpu, dt, s.E, s.n_embd, s.n_ff);
      auto table = gpu->make_expert_table(layer.device, ExpertMath{});
      ASSERT_NE(table, nullptr);
      for (bool norm : {true, false})
        expect_moe_routed_matches_host(*gpu, layer, *table, s, norm, ExpertMath{},
                                       std::string("moe_routed ") + std::string(dtype_name(dt)));
    }
}

// Backend::make_expert_table for gpt-oss's experts, Gemma 4's (with per-expert routing
// scales) and Llama 4's (sigmoid routing whose weights scale the inputs): none with
// SLUICE_CUDA_HOST_ROUTED=1 (they are routed on the host); without it, moe_routed from router
// logits against the host path at decode rows (the decode kernels), a few rows (the per-pair
// kernels) and prefill rows (the grouped tiles: tensor cores for bf16, q8 and q4, the f32
// tiles for mxfp4), for MXFP4, bf16, q8 and q4 weights.
TEST(CudaMoe, BackendMoeRoutedFamilyExpertMath) {
  ExpertMath scaled_inputs;
  scaled_inputs.scale_input = true;
  for (DType dt : {DType::mxfp4, DType::bf16, DType::q8, DType::q4})
    for (Shape s : {Shape{1, 8, 4, 256, 192}, {13, 8, 2, 256, 192}, {300, 8, 2, 256, 192}, {100, 8, 4, 256, 192},
                    {40, 16, 1, 256, 192}})
      for (const ExpertMath& math : {clamped_math(), kGeglu, scaled_inputs}) {
        auto gpu = make_cuda_backend(0);
        ExpertLayer layer(*gpu, dt, s.E, s.n_embd, s.n_ff, math);
        std::vector<float> scale;  // Gemma 4's per-expert scales
        if (math == kGeglu) scale = random_vec(s.E, 49, 1.0f);
        const TableRouting routing{math.scale_input ? RouterScoring::sigmoid : RouterScoring::softmax, scale};
        const char* name = math == kGeglu ? "geglu, scaled " : math.scale_input ? "sigmoid, inputs scaled " : "clamped, biased ";
        const ScopedEnv host_routed("SLUICE_CUDA_HOST_ROUTED", "1");
        EXPECT_EQ(gpu->make_expert_table(layer.device, math, routing), nullptr) << "a table with host routing forced";
        host_routed.set(nullptr);
        auto table = gpu->make_expert_table(layer.device, math, routing);
        ASSERT_NE(table, nullptr);
        expect_moe_routed_matches_host(*gpu, layer, *table, s, !math.scale_input, math,
                                       std::string("moe_routed ") + name + std::string(dtype_name(dt)), routing);
      }
}

// The grouped experts of a prefill on the tensor cores (moe_grouped.cu: the activations split
// into their bf16 parts beforehand, two stages) and on the f32 FMA tiles
// (SLUICE_CUDA_TENSOR_CORES=0) against the CPU, in tiles of 64 pairs (300 rows) and of 32
// (100 rows), and with n_ff and n_embd whole k steps but not whole 64-column tiles.
TEST(CudaMoe, GroupedKernelsMatchTheCpu) {
  for (DType dt : {DType::bf16, DType::q8, DType::q4})
    for (Shape s : {Shape{300, 8, 2, 256, 192}, {100, 8, 2, 256, 192}, {90, 6, 3, 160, 96}}) {
      auto gpu = make_cuda_backend(0);
      ExpertLayer layer(*gpu, dt, s.E, s.n_embd, s.n_ff);
      auto hv = random_vec(s.n * s.n_embd, 27);
      auto lv = random_vec(s.n * s.E, 28, 1.5f);
      auto table = gpu->make_expert_table(layer.device, ExpertMath{});
      ASSERT_NE(table, nullptr);
      Tensor h = gpu->alloc(DType::f32, {s.n, s.n_embd}), logits = gpu->alloc(DType::f32, {s.n, s.E});
      gpu->from_host(h, hv.data());
      gpu->from_host(logits, lv.data());
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(s.n) + " n_ff=" + std::to_string(s.n_ff);
      const auto want = cpu_routed(layer, route_topk(RouterSpec{s.E, s.k, true}, lv, s.n), hv, s.n_embd);
      std::vector<float> got[2];
      const ScopedEnv tensor_cores("SLUICE_CUDA_TENSOR_CORES", nullptr);
      for (int fma = 0; fma < 2; ++fma) {
        tensor_cores.set(fma ? "0" : "1");
        Tensor out = gpu->alloc(DType::f32, {s.n, s.n_embd});
        gpu->moe_routed(*table, logits, s.k, true, h, out);
        got[fma].resize(static_cast<size_t>(s.n * s.n_embd));
        gpu->to_host(out, got[fma].data());
        expect_close(got[fma], want, (fma ? "f32 tiles " : "tensor cores ") + what);
      }
      EXPECT_NE(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
          << what << ": the tensor cores gave the f32 tiles' bits: did they run?";
    }
}

}  // namespace
