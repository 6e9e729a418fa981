// CUDA ops against the CPU reference: random inputs at odd sizes, every weight dtype,
// sentinels after every output to catch out-of-bounds writes. f32 ops must agree within a
// normalized squared error of 1e-6 (the bound; f32 reordering gives ~1e-13).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/backends/attention_test_util.h"
#include "backends/backend.h"
#include "backends/cuda/gemm_bf16.h"
#include "tests/gpu/scoped_env.h"
#include "backends/cuda/kernels.h"
#include "core/quant.h"

using namespace sluice;
using sluice::test::attention_params;

namespace {

constexpr double kMaxNse = 1e-6;
constexpr float kSentinel = 1234.5f;
constexpr int64_t kGuard = 64;  // sentinel elements after each device output

struct Pair {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
};

std::vector<float> random_vec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A host tensor of the given dtype holding `values` (converted).
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor t;
  HostTensor(DType dtype, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
    t = Tensor(dtype, shape, nullptr);
    bytes.resize(t.nbytes());
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::f32) std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      else {
        uint16_t h = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    t.data = bytes.data();
  }
};

// An f32 tensor on the GPU with kGuard sentinels after it.
Tensor gpu_f32(Backend& gpu, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
  Tensor shaped(DType::f32, shape, nullptr);
  Tensor whole = gpu.alloc(DType::f32, {shaped.numel() + kGuard});
  std::vector<float> init(values);
  init.resize(shaped.numel(), 0.0f);
  init.resize(shaped.numel() + kGuard, kSentinel);
  gpu.from_host(whole, init.data());
  Tensor t = whole.reshape({shaped.numel() + kGuard}).slice_rows(0, shaped.numel());
  t.ndim = shaped.ndim;
  t.shape = shaped.shape;
  return t;
}
Tensor cpu_f32(Backend& cpu, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
  Tensor t = cpu.alloc(DType::f32, shape);
  std::vector<float> init(values);
  init.resize(t.numel(), 0.0f);
  cpu.from_host(t, init.data());
  return t;
}

std::vector<float> read_with_guard(Backend& gpu, const Tensor& t) {
  Tensor whole(DType::f32, {t.numel() + kGuard}, t.data);
  std::vector<float> v(t.numel() + kGuard);
  gpu.to_host(whole, v.data());
  return v;
}
std::vector<float> read(Backend& be, const Tensor& t) {
  std::vector<float> v(t.numel());
  be.to_host(t, v.data());
  return v;
}

// A tensor of dtype (f32 or bf16: rounded to nearest even) holding values, on be.
Tensor tensor_of(Backend& be, DType dtype, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
  HostTensor h(dtype, shape, values);
  Tensor t = be.alloc(dtype, shape);
  be.from_host(t, h.t.data);
  return t;
}
// An f32 or bf16 tensor's values as f32 (exact).
std::vector<float> read_f32(Backend& be, const Tensor& t) {
  if (t.dtype == DType::f32) return read(be, t);
  std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
  be.to_host(t, h.data());
  std::vector<float> v(h.size());
  dtype_row_to_f32(h.data(), t.dtype, t.numel(), v.data());
  return v;
}

void expect_close(const std::vector<float>& gpu_with_guard, const std::vector<float>& cpu, const char* what) {
  double num = 0, den = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    num += (double(gpu_with_guard[i]) - cpu[i]) * (double(gpu_with_guard[i]) - cpu[i]);
    den += double(cpu[i]) * cpu[i];
  }
  EXPECT_LE(num / std::max(den, 1e-30), kMaxNse) << what;
  for (size_t i = cpu.size(); i < gpu_with_guard.size(); ++i)
    ASSERT_EQ(gpu_with_guard[i], kSentinel) << what << ": write past the end at +" << i - cpu.size();
}

TEST(CudaOps, Matmul) {
  Pair p;
  for (DType wt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 17, 64, 70})  // matvec, matvec passes (<= 64 rows), tiles
      for (auto [m, k] : {std::pair<int64_t, int64_t>{5, 7}, {33, 63}, {129, 130}, {64, 256}, {8195, 72}, {300, 1024},
                             {1500, 200}, {3000, 2048}}) {
        auto xv = random_vec(n * k, 1), wv = random_vec(m * k, 2);
        HostTensor w(wt, {m, k}, wv);
        Tensor xc = cpu_f32(*p.cpu, {n, k}, xv), yc = p.cpu->alloc(DType::f32, {n, m});
        p.cpu->matmul(xc, w.t, yc);
        Tensor xg = gpu_f32(*p.gpu, {n, k}, xv), yg = gpu_f32(*p.gpu, {n, m}, {});
        p.gpu->matmul(xg, p.gpu->upload(w.t), yg);
        expect_close(read_with_guard(*p.gpu, yg), read(*p.cpu, yc),
                     ("matmul " + std::string(dtype_name(wt)) + " n=" + std::to_string(n) + " m=" + std::to_string(m)).c_str());
      }
}

// The output projection with the residual add and the next norm in one launch (matvec.cu's
// residual epilogue) against matmul then add_rms_norm on the GPU: the same bits (x and h),
// for the matvec shapes (m >= 8192: 4 rows a warp; 1024..8191: a row a warp; fewer: split
// k), bf16/f32/q4 weights, norm weights bf16/f32/none; twice (the counter is back at zero).
TEST(CudaOps, MatmulAddRmsNormIsMatmulThenAddRmsNorm) {
  Pair p;
  for (DType wt : {DType::bf16, DType::f32, DType::q4})
    for (auto [m, k] : {std::pair<int64_t, int64_t>{2048, 4096}, {8192, 256}, {512, 1024}, {4096, 64}})
      for (DType nt : {DType::bf16, DType::f32, DType::u8}) {  // u8: no norm weight
        const std::string what = str("matmul_add_rms_norm ", dtype_name(wt), " m=", m, " k=", k, " norm ",
                                     nt == DType::u8 ? "none" : dtype_name(nt));
        auto av = random_vec(k, 31), wv = random_vec(m * k, 32, 0.05f), xv = random_vec(m, 33), nv = random_vec(m, 34);
        Tensor wg;
        std::vector<uint8_t> data, scales;
        if (wt == DType::q4) {
          data.resize(m * quant_row_bytes(wt, k));
          scales.resize(m * quant_scale_row_bytes(wt, k));
          for (int64_t r = 0; r < m; ++r)
            quantize_row(wt, wv.data() + r * k, k, data.data() + r * quant_row_bytes(wt, k),
                         scales.data() + r * quant_scale_row_bytes(wt, k));
          Tensor w(wt, {m, k}, data.data());
          w.scales = scales.data();
          wg = p.gpu->upload(w);
        } else {
          wg = p.gpu->upload(HostTensor(wt, {m, k}, wv).t);
        }
        Tensor ng = nt == DType::u8 ? Tensor{} : p.gpu->upload(HostTensor(nt, {m}, nv).t);
        Tensor a = gpu_f32(*p.gpu, {1, k}, av);
        // Unfused: y = a . w^T; x += y; h = norm(x).
        Tensor x0 = gpu_f32(*p.gpu, {1, m}, xv), h0 = gpu_f32(*p.gpu, {1, m}, {}), y = gpu_f32(*p.gpu, {1, m}, {});
        p.gpu->matmul(a, wg, y);
        p.gpu->add_rms_norm(x0, y, ng, 1e-6f, h0);
        const std::vector<float> want_x = read(*p.gpu, x0), want_h = read(*p.gpu, h0);
        for (int rep = 0; rep < 2; ++rep) {
          Tensor x1 = gpu_f32(*p.gpu, {1, m}, xv), h1 = gpu_f32(*p.gpu, {1, m}, {});
          p.gpu->matmul_add_rms_norm(a, wg, x1, ng, 1e-6f, h1);
          const std::vector<float> got_x = read(*p.gpu, x1), got_h = read(*p.gpu, h1);
          ASSERT_EQ(std::memcmp(got_x.data(), want_x.data(), want_x.size() * sizeof(float)), 0) << what << " x";
          ASSERT_EQ(std::memcmp(got_h.data(), want_h.data(), want_h.size() * sizeof(float)), 0) << what << " h";
        }
      }
}

double nse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / std::max(den, 1e-30);
}

// Prefill products of the weight types the tensor cores take (mma_tile.cuh: bf16, q8, q4 with
// k a multiple of 32; bf16 on cuBLAS, gemm_bf16.h), partial tiles in rows and columns, against
// the CPU. The activations reach the tensor cores as three bf16 parts carrying all 24 bits, so
// only the order (and the tensor cores' truncating adds) differs from f32: the bound is 1e-11,
// five orders below kMaxNse, where two parts (16 bits) would give ~1e-10 and one bf16 rounding
// ~1e-6. Each shape is also run with SLUICE_CUDA_CUBLAS=0 (bf16 on the hand-written tiles) and
// SLUICE_CUDA_TENSOR_CORES=0 (the f32 FMA tiles) against the same CPU result.
TEST(CudaOps, MatmulTensorCores) {
  Pair p;
  constexpr double kTensorCoreNse = 1e-11;
  enum Path { kDefault, kTiles, kF32Tiles };
  const char* const path_name[] = {"default (bf16: cuBLAS)", "tensor-core tiles", "f32 tiles"};
  for (DType wt : {DType::bf16, DType::q8, DType::q4}) {
    double worst[3] = {0, 0, 0};
    for (int64_t n : {5, 63, 64, 65, 200, 513})
      // (m >= kMatvecPassMaxCols: up to 64 rows too take the tiles, e.g. an output head)
      for (auto [m, k] : {std::pair<int64_t, int64_t>{64, 32}, {130, 96}, {1, 64}, {2056, 512}, {96, 2048}, {16400, 64}}) {
        auto xv = random_vec(n * k, 11), wv = random_vec(m * k, 12, 0.05f);
        std::vector<uint8_t> qdata, qscales;
        HostTensor bf(DType::bf16, {m, k}, wv);
        Tensor w = bf.t;
        if (wt != DType::bf16) {
          qdata.resize(static_cast<size_t>(m * quant_row_bytes(wt, k)));
          qscales.resize(static_cast<size_t>(m * quant_scale_row_bytes(wt, k)));
          for (int64_t r = 0; r < m; ++r)
            ASSERT_TRUE(quantize_row(wt, wv.data() + r * k, k, qdata.data() + r * quant_row_bytes(wt, k),
                                     qscales.data() + r * quant_scale_row_bytes(wt, k)));
          w = Tensor(wt, {m, k}, qdata.data());
          w.scales = qscales.data();
        }
        Tensor xc = cpu_f32(*p.cpu, {n, k}, xv), yc = p.cpu->alloc(DType::f32, {n, m});
        p.cpu->matmul(xc, w, yc);
        const auto want = read(*p.cpu, yc);
        Tensor wg = p.gpu->upload(w);
        const std::string what =
            "matmul " + std::string(dtype_name(wt)) + " n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" +
            std::to_string(k);
        for (Path path : {kDefault, kTiles, kF32Tiles}) {
          if (path == kTiles && wt != DType::bf16) continue;  // the default path already
          std::vector<float> got;
          {
            std::optional<ScopedEnv> cublas, tensor_cores;
            if (path == kTiles) cublas.emplace("SLUICE_CUDA_CUBLAS", "0");
            if (path == kF32Tiles) tensor_cores.emplace("SLUICE_CUDA_TENSOR_CORES", "0");
            Tensor xg = gpu_f32(*p.gpu, {n, k}, xv), yg = gpu_f32(*p.gpu, {n, m}, {});
            p.gpu->matmul(xg, wg, yg);
            got = read_with_guard(*p.gpu, yg);
          }
          worst[path] = std::max(worst[path], nse(got, want));
          if (path != kF32Tiles)
            EXPECT_LE(nse(got, want), kTensorCoreNse) << what << " (" << path_name[path] << ")";
          else
            expect_close(got, want, (what + " (f32 tiles)").c_str());
          for (int64_t i = n * m; i < n * m + kGuard; ++i)
            ASSERT_EQ(got[static_cast<size_t>(i)], kSentinel) << what << ": write past the end";
        }
      }
    std::printf("matmul %s: worst normalized squared error, %s %.3g, tensor-core tiles %.3g, f32 tiles %.3g\n",
                std::string(dtype_name(wt)).c_str(), path_name[kDefault], worst[kDefault],
                wt == DType::bf16 ? worst[kTiles] : worst[kDefault], worst[kF32Tiles]);
  }
}

// A bf16 product of more rows than one cuBLAS pass takes (CublasGemm::rows_per_pass): the
// second pass's rows land where they belong.
TEST(CudaOps, MatmulCublasPasses) {
  Pair p;
  const int64_t k = 2048, m = 72, n = cuda::CublasGemm::rows_per_pass(k) + 37;
  auto xv = random_vec(n * k, 21), wv = random_vec(m * k, 22, 0.05f);
  HostTensor w(DType::bf16, {m, k}, wv);
  Tensor xc = cpu_f32(*p.cpu, {n, k}, xv), yc = p.cpu->alloc(DType::f32, {n, m});
  p.cpu->matmul(xc, w.t, yc);
  const auto want = read(*p.cpu, yc);
  Tensor xg = gpu_f32(*p.gpu, {n, k}, xv), yg = gpu_f32(*p.gpu, {n, m}, {});
  p.gpu->matmul(xg, p.gpu->upload(w.t), yg);
  const auto got = read_with_guard(*p.gpu, yg);
  EXPECT_LE(nse(got, want), 1e-11);
  for (int64_t r : {int64_t{0}, n - 38, n - 37, n - 1}) {  // each side of the pass boundary
    double num = 0, den = 0;
    for (int64_t c = 0; c < m; ++c) {
      const double d = double(got[r * m + c]) - want[r * m + c];
      num += d * d;
      den += double(want[r * m + c]) * want[r * m + c];
    }
    EXPECT_LE(num / std::max(den, 1e-30), 1e-11) << "row " << r;
  }
  for (int64_t i = n * m; i < n * m + kGuard; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], kSentinel);
}

TEST(CudaOps, RmsNormRopeElementwise) {
  Pair p;
  const int64_t n = 5, heads = 3, d = 24, rot = 16;
  auto xv = random_vec(n * heads * d, 3), wv = random_vec(d, 4), yv = random_vec(n * heads * d, 5);
  HostTensor w(DType::bf16, {d}, wv);
  // rms_norm over head_dim rows
  Tensor xc = cpu_f32(*p.cpu, {n * heads, d}, xv), oc = p.cpu->alloc(DType::f32, {n * heads, d});
  p.cpu->rms_norm(xc, w.t, 1e-6f, oc);
  Tensor xg = gpu_f32(*p.gpu, {n * heads, d}, xv), og = gpu_f32(*p.gpu, {n * heads, d}, {});
  p.gpu->rms_norm(xg, p.gpu->upload(w.t), 1e-6f, og);
  expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), "rms_norm");
  // rope, both layouts
  auto cv = random_vec(n * rot / 2, 6), sv = random_vec(n * rot / 2, 7);
  for (bool inter : {false, true}) {
    Tensor a = cpu_f32(*p.cpu, {n, heads, d}, xv), b = gpu_f32(*p.gpu, {n, heads, d}, xv);
    p.cpu->rope(a, cpu_f32(*p.cpu, {n, rot / 2}, cv), cpu_f32(*p.cpu, {n, rot / 2}, sv), rot, inter);
    p.gpu->rope(b, gpu_f32(*p.gpu, {n, rot / 2}, cv), gpu_f32(*p.gpu, {n, rot / 2}, sv), rot, inter);
    expect_close(read_with_guard(*p.gpu, b), read(*p.cpu, a), inter ? "rope gpt-j" : "rope neox");
  }
  // swiglu, add, clamp
  Tensor gc = cpu_f32(*p.cpu, {n, heads * d}, xv), uc = cpu_f32(*p.cpu, {n, heads * d}, yv);
  Tensor gg = gpu_f32(*p.gpu, {n, heads * d}, xv), ug = gpu_f32(*p.gpu, {n, heads * d}, yv);
  p.cpu->swiglu(gc, uc, gc);
  p.gpu->swiglu(gg, ug, gg);
  expect_close(read_with_guard(*p.gpu, gg), read(*p.cpu, gc), "swiglu");
  p.cpu->add(gc, uc);
  p.gpu->add(gg, ug);
  expect_close(read_with_guard(*p.gpu, gg), read(*p.cpu, gc), "add");
  p.cpu->clamp(gc, -0.5f, 0.7f);
  p.gpu->clamp(gg, -0.5f, 0.7f);
  expect_close(read_with_guard(*p.gpu, gg), read(*p.cpu, gc), "clamp");
}

TEST(CudaOps, Attention) {
  Pair p;
  // d = 40: the warp-per-query kernel; 64 and 128: a lane per key (chunks of 32 keys over 8
  // warps: 700 past positions span several chunks per warp, window 5 and 300 cut inside one).
  for (int64_t d : {40, 64, 128})
  for (auto [n, n_past, window] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 0}, {7, 0, 0}, {1, 40, 0}, {9, 13, 0},
                                   {9, 13, 5}, {1, 700, 0}, {3, 700, 300}, {33, 70, 0}}) {
    const int64_t hq = 6, hkv = 2, ctx = n_past + n + 3;
    auto qv = random_vec(n * hq * d, 8), kv = random_vec(ctx * hkv * d, 9), vv = random_vec(ctx * hkv * d, 10);
    AttentionParams ap = attention_params(n_past, 0.15f, window);
    Tensor oc = p.cpu->alloc(DType::f32, {n, hq, d});
    p.cpu->attention(cpu_f32(*p.cpu, {n, hq, d}, qv), cpu_f32(*p.cpu, {ctx, hkv, d}, kv),
                     cpu_f32(*p.cpu, {ctx, hkv, d}, vv), oc, ap);
    Tensor og = gpu_f32(*p.gpu, {n, hq, d}, {});
    p.gpu->attention(gpu_f32(*p.gpu, {n, hq, d}, qv), gpu_f32(*p.gpu, {ctx, hkv, d}, kv),
                     gpu_f32(*p.gpu, {ctx, hkv, d}, vv), og, ap);
    expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc),
                 ("attention d=" + std::to_string(d) + " n=" + std::to_string(n) + " n_past=" + std::to_string(n_past) +
                  " window=" + std::to_string(window)).c_str());
  }
}

TEST(CudaOps, AddRmsNormIsAddThenNormBitForBit) {
  Pair p;
  for (int64_t rows : {1, 3})
    for (int64_t cols : {24, 2048, 2051}) {
      auto xv = random_vec(rows * cols, 30), yv = random_vec(rows * cols, 31), wv = random_vec(cols, 32);
      HostTensor w(DType::bf16, {cols}, wv);
      Tensor wg = p.gpu->upload(w.t);
      // Fused on the GPU, against the CPU's add + rms_norm and the GPU's two launches.
      Tensor xg = gpu_f32(*p.gpu, {rows, cols}, xv), yg = gpu_f32(*p.gpu, {rows, cols}, yv);
      Tensor og = gpu_f32(*p.gpu, {rows, cols}, {});
      p.gpu->add_rms_norm(xg, yg, wg, 1e-6f, og);
      Tensor xc = cpu_f32(*p.cpu, {rows, cols}, xv), oc = p.cpu->alloc(DType::f32, {rows, cols});
      p.cpu->add_rms_norm(xc, cpu_f32(*p.cpu, {rows, cols}, yv), w.t, 1e-6f, oc);
      const std::string what = "add_rms_norm " + std::to_string(rows) + "x" + std::to_string(cols);
      expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), what.c_str());
      expect_close(read_with_guard(*p.gpu, xg), read(*p.cpu, xc), (what + " (the sum)").c_str());
      Tensor x2 = gpu_f32(*p.gpu, {rows, cols}, xv), o2 = gpu_f32(*p.gpu, {rows, cols}, {});
      p.gpu->add(x2, gpu_f32(*p.gpu, {rows, cols}, yv));
      p.gpu->rms_norm(x2, wg, 1e-6f, o2);
      EXPECT_EQ(read(*p.gpu, og), read(*p.gpu, o2)) << what;
    }
}

TEST(CudaOps, AttentionInputsNormRotateAndAppend) {
  // Per-head norms on and off, both rotary layouts, partial rotary, the cache rows from n_past
  // or from a positions tensor; the CPU runs the default (rms_norm, rope, copy/scatter).
  Pair p;
  const int64_t nh = 6, nkv = 2, d = 64, ctx = 40;
  for (int64_t n : {1, 5})
    for (int64_t rot : {64, 32})
      for (bool inter : {false, true})
        for (bool norms : {false, true})
          for (bool at : {false, true}) {
            const int64_t n_past = 9;
            auto qv = random_vec(n * nh * d, 40), kv = random_vec(n * nkv * d, 41), vv = random_vec(n * nkv * d, 42);
            auto cv = random_vec(n * rot / 2, 43), sv = random_vec(n * rot / 2, 44), cache = random_vec(ctx * nkv * d, 45);
            auto qn = random_vec(d, 46), kn = random_vec(d, 47);
            HostTensor qw(DType::bf16, {d}, qn), kw(DType::f32, {d}, kn);
            std::vector<int32_t> pos(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(30 - 3 * i);
            auto run = [&](Backend& be, bool gpu) {
              auto t = [&](std::initializer_list<int64_t> shape, const std::vector<float>& v) {
                return gpu ? gpu_f32(be, shape, v) : cpu_f32(be, shape, v);
              };
              Tensor q = t({n, nh, d}, qv), k = t({n, nkv, d}, kv), v = t({n, nkv, d}, vv);
              Tensor kc = t({ctx, nkv, d}, cache), vc = t({ctx, nkv, d}, cache);
              Tensor positions;
              if (at) {
                positions = be.alloc(DType::i32, {n});
                be.from_host(positions, pos.data());
              }
              be.attention_inputs(q, k, v, norms ? (gpu ? be.upload(qw.t) : qw.t) : Tensor{},
                                  norms ? (gpu ? be.upload(kw.t) : kw.t) : Tensor{}, 1e-6f, t({n, rot / 2}, cv),
                                  t({n, rot / 2}, sv), rot, inter, kc, vc, n_past, positions);
              return std::vector<Tensor>{q, k, kc, vc};
            };
            auto c = run(*p.cpu, false);
            auto g = run(*p.gpu, true);
            const std::string what = "attention_inputs n=" + std::to_string(n) + " rot=" + std::to_string(rot) +
                                     (inter ? " gpt-j" : " neox") + (norms ? " normed" : "") + (at ? " at" : "");
            const char* names[] = {" q", " k", " k cache", " v cache"};
            for (int i = 0; i < 4; ++i)
              expect_close(read_with_guard(*p.gpu, g[i]), read(*p.cpu, c[i]), (what + names[i]).c_str());
          }
}

// A batch decode step's attention (Backend::attention_inputs_rows, attention_rows: one launch
// each on CUDA, every row a sequence with caches of its own, of different capacities and at
// different positions, from a positions tensor or staged) against the CPU's default, a row at
// a time; grouped-query shapes the one-launch kernel takes, full and sliding window, and MHA
// (hq == hkv: the per-row fallback on CUDA too).
// kv_dtype: the caches' (f32, or bf16: the CPU's bf16 caches the reference).
void attention_rows_cases(DType kv_dtype) {
  Pair p;
  for (auto [hq, hkv, d] : {std::tuple<int64_t, int64_t, int64_t>{8, 2, 128}, {32, 4, 64}, {16, 1, 256}, {4, 4, 64}})
    for (int64_t n : {2, 7, 64})
      for (int64_t window : {0, 37})
        for (bool at : {true, false}) {
          std::vector<int64_t> n_past(static_cast<size_t>(n)), ctx(static_cast<size_t>(n));
          for (int64_t b = 0; b < n; ++b) {
            n_past[static_cast<size_t>(b)] = (b * 389 + 11) % 900;
            ctx[static_cast<size_t>(b)] = n_past[static_cast<size_t>(b)] + 1 + (b % 3) * 50;
          }
          const uint32_t seed = static_cast<uint32_t>(hq * 1000 + n * 10 + window);
          auto qv = random_vec(n * hq * d, seed), kv = random_vec(n * hkv * d, seed + 1),
               vv = random_vec(n * hkv * d, seed + 2), cv = random_vec(n * d / 2, seed + 3),
               sv = random_vec(n * d / 2, seed + 4), qn = random_vec(d, seed + 5), kn = random_vec(d, seed + 6);
          HostTensor qw(DType::bf16, {d}, qn), kw(DType::bf16, {d}, kn);
          auto run = [&](Backend& be, bool gpu) {
            auto t = [&](std::initializer_list<int64_t> shape, const std::vector<float>& v) {
              return gpu ? gpu_f32(be, shape, v) : cpu_f32(be, shape, v);
            };
            std::vector<Tensor> kc, vc;
            auto cache = [&](std::initializer_list<int64_t> shape, const std::vector<float>& v) {
              return kv_dtype == DType::f32 ? t(shape, v) : tensor_of(be, kv_dtype, shape, v);
            };
            for (int64_t b = 0; b < n; ++b) {
              const int64_t c = ctx[static_cast<size_t>(b)];
              kc.push_back(cache({c, hkv, d}, random_vec(c * hkv * d, seed + 100 + static_cast<uint32_t>(b))));
              vc.push_back(cache({c, hkv, d}, random_vec(c * hkv * d, seed + 200 + static_cast<uint32_t>(b))));
            }
            Tensor positions;
            if (at) {
              std::vector<int32_t> pos(n_past.begin(), n_past.end());
              positions = be.alloc(DType::i32, {n});
              be.from_host(positions, pos.data());
            }
            const Backend::RowCaches caches{kc, vc, n_past, positions};
            Tensor q = t({n, hq, d}, qv), k = t({n, hkv, d}, kv), v = t({n, hkv, d}, vv);
            be.attention_inputs_rows(q, k, v, gpu ? be.upload(qw.t) : qw.t, gpu ? be.upload(kw.t) : kw.t, 1e-6f,
                                     t({n, d / 2}, cv), t({n, d / 2}, sv), d, false, caches);
            Tensor out = t({n, hq, d}, {});
            be.attention_rows(q, out, caches, 0.088f, window);
            std::vector<Tensor> all = {out, q};
            all.insert(all.end(), kc.begin(), kc.end());
            return all;
          };
          auto c = run(*p.cpu, false);
          auto g = run(*p.gpu, true);
          const std::string what = "attention_rows hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
                                   " d=" + std::to_string(d) + " n=" + std::to_string(n) + " window=" +
                                   std::to_string(window) + (at ? " positions" : " staged") + " " +
                                   std::string(dtype_name(kv_dtype));
          expect_close(read_with_guard(*p.gpu, g[0]), read(*p.cpu, c[0]), (what + " out").c_str());
          expect_close(read_with_guard(*p.gpu, g[1]), read(*p.cpu, c[1]), (what + " q").c_str());
          for (size_t b = 2; b < c.size(); ++b)
            expect_close(kv_dtype == DType::f32 ? read_with_guard(*p.gpu, g[b]) : read_f32(*p.gpu, g[b]), read_f32(*p.cpu, c[b]),
                         (what + " k cache " + std::to_string(b - 2)).c_str());
        }
}

// gpt-oss's attention sinks through every CUDA attention kernel the backend picks, against the
// CPU's attention with the same sinks: the per-row kernels (d = 40: a warp a query; 64, 128:
// a lane a key), the tensor-core prefill (65 and 200 rows), the split decode kernels (per head,
// hq == hkv; grouped-query) with one split and with several (the merge launch), sliding
// windows, f32 and bf16 caches, and a batch decode step (attention_rows, one launch). Sinks
// from -3 to 3 with one head's above every score (the sink is the row's max) and one head's
// -inf (no sink: the bits of a run without). Cache positions past the last query hold NaN.
TEST(CudaOps, AttentionSinksEveryKernel) {
  Pair p;
  struct Case {
    int64_t n, n_past, ctx, hq, hkv, d, window;
  };
  for (DType kvt : {DType::f32, DType::bf16})
    for (const Case& c : {Case{7, 0, 10, 6, 2, 40, 0}, Case{9, 13, 25, 6, 2, 64, 5}, Case{33, 70, 106, 6, 2, 128, 0},
                         Case{65, 0, 70, 4, 4, 64, 0}, Case{200, 77, 280, 8, 2, 128, 50}, Case{1, 37, 40, 4, 4, 128, 0},
                         Case{1, 3000, 4096, 4, 4, 64, 0}, Case{1, 37, 40, 8, 2, 64, 0}, Case{1, 3000, 4096, 32, 4, 128, 0},
                         Case{1, 999, 1024, 32, 4, 128, 64}}) {
      auto qv = random_vec(c.n * c.hq * c.d, 81), kv = random_vec(c.ctx * c.hkv * c.d, 82),
           vv = random_vec(c.ctx * c.hkv * c.d, 83), sv = random_vec(c.hq, 84, 1.5f);
      for (int64_t i = (c.n_past + c.n) * c.hkv * c.d; i < c.ctx * c.hkv * c.d; ++i) kv[i] = vv[i] = NAN;
      sv[0] = 40.0f;       // above every score
      sv[1] = -INFINITY;  // no sink for this head
      AttentionParams ap = attention_params(c.n_past, 1.0f / std::sqrt(static_cast<float>(c.d)), c.window, cpu_f32(*p.cpu, {c.hq}, sv));
      Tensor oc = p.cpu->alloc(DType::f32, {c.n, c.hq, c.d});
      p.cpu->attention(cpu_f32(*p.cpu, {c.n, c.hq, c.d}, qv), tensor_of(*p.cpu, kvt, {c.ctx, c.hkv, c.d}, kv),
                       tensor_of(*p.cpu, kvt, {c.ctx, c.hkv, c.d}, vv), oc, ap);
      ap.sinks = gpu_f32(*p.gpu, {c.hq}, sv);
      Tensor og = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
      p.gpu->attention(gpu_f32(*p.gpu, {c.n, c.hq, c.d}, qv), tensor_of(*p.gpu, kvt, {c.ctx, c.hkv, c.d}, kv),
                       tensor_of(*p.gpu, kvt, {c.ctx, c.hkv, c.d}, vv), og, ap);
      const std::vector<float> want = read(*p.cpu, oc), got = read_with_guard(*p.gpu, og);
      const std::string what = str("sinks attention n=", c.n, " n_past=", c.n_past, " ctx=", c.ctx, " hq=", c.hq,
                                   " hkv=", c.hkv, " d=", c.d, " window=", c.window, " ", dtype_name(kvt));
      expect_close(got, want, what.c_str());
      // Head 0's sink takes nearly all the mass: its outputs are ~0, and the CUDA ones too.
      float head0 = 0.0f;
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t e = 0; e < c.d; ++e) head0 = std::max(head0, std::fabs(got[static_cast<size_t>((i * c.hq) * c.d + e)]));
      EXPECT_LT(head0, 1e-6f) << what;
    }
  // A batch decode step with sinks: one launch on CUDA, a row at a time on the CPU.
  const int64_t hq = 8, hkv = 2, d = 128, n = 3;
  const std::vector<int64_t> n_past = {5, 300, 41}, ctx = {6, 400, 41 + 1};
  auto sv = random_vec(hq, 85, 1.5f);
  auto run = [&](Backend& be, bool gpu) {
    auto t = [&](std::initializer_list<int64_t> shape, const std::vector<float>& v) {
      return gpu ? gpu_f32(be, shape, v) : cpu_f32(be, shape, v);
    };
    std::vector<Tensor> kc, vc;
    for (int64_t b = 0; b < n; ++b) {
      const int64_t c = ctx[static_cast<size_t>(b)];
      kc.push_back(t({c, hkv, d}, random_vec(c * hkv * d, 90 + static_cast<uint32_t>(b))));
      vc.push_back(t({c, hkv, d}, random_vec(c * hkv * d, 95 + static_cast<uint32_t>(b))));
    }
    const Backend::RowCaches caches{kc, vc, n_past, {}};
    Tensor out = t({n, hq, d}, {});
    be.attention_rows(t({n, hq, d}, random_vec(n * hq * d, 99)), out, caches, 0.088f, 0, t({hq}, sv));
    return out;
  };
  Tensor oc = run(*p.cpu, false), og = run(*p.gpu, true);
  expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), "sinks attention_rows");
}

// Llama 4's chunked attention and attention temperature through every CUDA attention kernel
// the backend picks, against the CPU's: the per-row kernels (d = 40, 64), the tensor-core
// prefill with chunks (65 and 200 rows; with a temperature the rows go to the per-row kernel),
// the split decode kernels per head and grouped-query with one and several splits, chunks
// inside and across splits, with a window too, f32 and bf16 caches. Cache positions past the
// last query hold NaN.
TEST(CudaOps, AttentionChunksAndTemperatureEveryKernel) {
  Pair p;
  struct Case {
    int64_t n, n_past, ctx, hq, hkv, d, window, chunk, floor_scale;
  };
  for (DType kvt : {DType::f32, DType::bf16})
    for (const Case& c : {Case{7, 0, 10, 6, 2, 40, 0, 4, 0}, Case{9, 13, 25, 6, 2, 64, 0, 8, 3},
                         Case{65, 0, 70, 4, 4, 64, 0, 16, 0}, Case{200, 77, 280, 8, 2, 128, 0, 64, 0},
                         Case{200, 77, 280, 8, 2, 128, 50, 64, 0}, Case{130, 5, 140, 4, 1, 64, 0, 32, 8},
                         Case{1, 37, 40, 4, 4, 128, 0, 8, 4}, Case{1, 3000, 4096, 4, 4, 64, 0, 1024, 1000},
                         Case{1, 3000, 4096, 32, 4, 128, 0, 2048, 0}, Case{1, 2999, 4096, 32, 4, 128, 100, 1000, 7},
                         Case{1, 37, 40, 8, 2, 64, 0, 0, 5}}) {
      auto qv = random_vec(c.n * c.hq * c.d, 91), kv = random_vec(c.ctx * c.hkv * c.d, 92),
           vv = random_vec(c.ctx * c.hkv * c.d, 93);
      for (int64_t i = (c.n_past + c.n) * c.hkv * c.d; i < c.ctx * c.hkv * c.d; ++i) kv[i] = vv[i] = NAN;
      AttentionParams ap = attention_params(c.n_past, 1.0f / std::sqrt(static_cast<float>(c.d)), c.window);
      ap.chunk = c.chunk;
      ap.temperature_floor_scale = c.floor_scale;
      ap.temperature_attn_scale = 0.1f;
      Tensor oc = p.cpu->alloc(DType::f32, {c.n, c.hq, c.d});
      p.cpu->attention(cpu_f32(*p.cpu, {c.n, c.hq, c.d}, qv), tensor_of(*p.cpu, kvt, {c.ctx, c.hkv, c.d}, kv),
                       tensor_of(*p.cpu, kvt, {c.ctx, c.hkv, c.d}, vv), oc, ap);
      Tensor og = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
      p.gpu->attention(gpu_f32(*p.gpu, {c.n, c.hq, c.d}, qv), tensor_of(*p.gpu, kvt, {c.ctx, c.hkv, c.d}, kv),
                       tensor_of(*p.gpu, kvt, {c.ctx, c.hkv, c.d}, vv), og, ap);
      expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc),
                   str("chunks/temperature attention n=", c.n, " n_past=", c.n_past, " ctx=", c.ctx, " hq=", c.hq,
                       " hkv=", c.hkv, " d=", c.d, " window=", c.window, " chunk=", c.chunk, " floor_scale=",
                       c.floor_scale, " ", dtype_name(kvt))
                       .c_str());
    }
}

// gpt-oss's clamped SwiGLU against the CPU's (values both sides of the limit, NaN kept).
TEST(CudaOps, SwigluClamped) {
  Pair p;
  for (int64_t n : {1, 37, 5000}) {
    auto gv = random_vec(n, 86, 6.0f), uv = random_vec(n, 87, 6.0f);
    Tensor gc = cpu_f32(*p.cpu, {n}, gv), uc = cpu_f32(*p.cpu, {n}, uv);
    Tensor gg = gpu_f32(*p.gpu, {n}, gv), ug = gpu_f32(*p.gpu, {n}, uv);
    p.cpu->swiglu_clamped(gc, uc, gc, 1.702f, 7.0f);
    p.gpu->swiglu_clamped(gg, ug, gg, 1.702f, 7.0f);
    expect_close(read_with_guard(*p.gpu, gg), read(*p.cpu, gc), ("swiglu_clamped n=" + std::to_string(n)).c_str());
  }
  Tensor g = gpu_f32(*p.gpu, {2}, {NAN, 1.0f}), u = gpu_f32(*p.gpu, {2}, {1.0f, NAN});
  p.gpu->swiglu_clamped(g, u, g, 1.702f, 7.0f);
  const std::vector<float> out = read(*p.gpu, g);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
}

TEST(CudaOps, AttentionRowsEachRowItsOwnCache) { attention_rows_cases(DType::f32); }
TEST(CudaOps, AttentionRowsEachRowItsOwnBf16Cache) { attention_rows_cases(DType::bf16); }

// Every CUDA attention kernel on bf16 caches (Backend::kv_dtype bf16) through the backend,
// against the CPU's attention on the same bf16 caches (the f32 attention of the rounded
// values): the per-row kernels (d = 40: a warp a query; 64, 128: a lane a key), the split
// decode kernels (per head and grouped-query, one to many splits, capacities above the
// position, sliding windows), the tensor-core prefill kernel (64 rows and more, windows, one
// and several query heads a kv head). Cache positions past the last query hold NaN: a kernel
// that reads them, even masked, fails.
TEST(CudaOps, AttentionReadsBf16Caches) {
  Pair p;
  struct Case {
    int64_t n, n_past, ctx, hq, hkv, d, window;
  };
  for (const Case c : {Case{7, 0, 10, 6, 2, 40, 0}, Case{9, 13, 25, 6, 2, 40, 5}, Case{3, 700, 706, 6, 2, 64, 300},
                       Case{33, 70, 106, 6, 2, 128, 0}, Case{9, 13, 25, 6, 2, 128, 0},
                       Case{1, 0, 1, 4, 4, 128, 0}, Case{1, 37, 40, 6, 2, 64, 0}, Case{1, 543, 576, 8, 1, 128, 0},
                       Case{1, 3000, 4096, 32, 4, 128, 0}, Case{1, 700, 800, 16, 1, 128, 100},
                       Case{1, 300, 1000, 8, 2, 256, 0}, Case{1, 9000, 9100, 12, 3, 64, 4096},
                       Case{1, 5, 20000, 8, 8, 128, 3}, Case{1, 8191, 8320, 32, 4, 128, 0},
                       Case{1, 4100, 8320, 64, 4, 128, 0}, Case{1, 5000, 6000, 32, 4, 256, 0},
                       Case{1, 999, 1024, 32, 4, 128, 64}, Case{1, 31, 32, 32, 4, 128, 0},
                       Case{1, 1000, 1100, 48, 2, 64, 0}, Case{1, 2047, 2048, 32, 8, 128, 0},
                       Case{65, 0, 70, 4, 4, 64, 0}, Case{128, 77, 210, 8, 2, 128, 0},
                       Case{200, 77, 280, 8, 1, 256, 50}, Case{1000, 0, 1005, 8, 2, 128, 0},
                       Case{130, 5, 140, 4, 1, 64, 1}}) {
    auto qv = random_vec(c.n * c.hq * c.d, 61), kv = random_vec(c.ctx * c.hkv * c.d, 62),
         vv = random_vec(c.ctx * c.hkv * c.d, 63);
    for (int64_t i = (c.n_past + c.n) * c.hkv * c.d; i < c.ctx * c.hkv * c.d; ++i) kv[i] = vv[i] = NAN;
    const AttentionParams ap = attention_params(c.n_past, 1.0f / std::sqrt(static_cast<float>(c.d)), c.window);
    Tensor oc = p.cpu->alloc(DType::f32, {c.n, c.hq, c.d});
    p.cpu->attention(cpu_f32(*p.cpu, {c.n, c.hq, c.d}, qv), tensor_of(*p.cpu, DType::bf16, {c.ctx, c.hkv, c.d}, kv),
                     tensor_of(*p.cpu, DType::bf16, {c.ctx, c.hkv, c.d}, vv), oc, ap);
    Tensor og = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
    p.gpu->attention(gpu_f32(*p.gpu, {c.n, c.hq, c.d}, qv), tensor_of(*p.gpu, DType::bf16, {c.ctx, c.hkv, c.d}, kv),
                     tensor_of(*p.gpu, DType::bf16, {c.ctx, c.hkv, c.d}, vv), og, ap);
    expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc),
                 str("bf16-cache attention n=", c.n, " n_past=", c.n_past, " ctx=", c.ctx, " hq=", c.hq, " hkv=", c.hkv,
                     " d=", c.d, " window=", c.window)
                     .c_str());
  }
}

// The decode attention's tensor-core kernel (attention_decode_mma.cu: bf16 caches, 2 to 16
// query heads a kv head, 64 or 128 dims) at positions on both sides of its stages (64 keys) and
// of its warps' 16 keys, capacities at and past the position (one split up to 4 stages of 64
// keys, many past them), windows, against the CPU's
// attention and against the FMA kernel it replaces
// (SLUICE_CUDA_ATTENTION_MMA=0); the two kernels' bits differ somewhere, so the tensor-core
// one ran. Cache positions past the query hold NaN.
TEST(CudaOps, DecodeAttentionOnTensorCores) {
  Pair p;
  struct Case {
    int64_t n_past, ctx, hq, hkv, d, window;
  };
  bool differs = false;
  for (const Case c : {Case{0, 1, 8, 4, 128, 0}, Case{14, 15, 4, 2, 128, 0}, Case{15, 16, 16, 1, 64, 0},
                       Case{16, 17, 6, 2, 64, 0}, Case{63, 64, 8, 1, 128, 0}, Case{64, 65, 32, 4, 128, 0},
                       Case{65, 4096, 32, 4, 128, 0}, Case{200, 8192, 12, 4, 64, 0}, Case{1000, 1001, 20, 2, 128, 0},
                       Case{5000, 8320, 32, 4, 128, 0}, Case{8191, 8320, 32, 4, 128, 0},
                       Case{5000, 8320, 32, 4, 128, 300}, Case{777, 2000, 64, 4, 128, 17}}) {
    auto qv = random_vec(c.hq * c.d, 71), kv = random_vec(c.ctx * c.hkv * c.d, 72),
         vv = random_vec(c.ctx * c.hkv * c.d, 73, 2.0f);
    for (int64_t i = (c.n_past + 1) * c.hkv * c.d; i < c.ctx * c.hkv * c.d; ++i) kv[i] = vv[i] = NAN;
    const AttentionParams ap = attention_params(c.n_past, 1.0f / std::sqrt(static_cast<float>(c.d)), c.window);
    Tensor oc = p.cpu->alloc(DType::f32, {1, c.hq, c.d});
    p.cpu->attention(cpu_f32(*p.cpu, {1, c.hq, c.d}, qv), tensor_of(*p.cpu, DType::bf16, {c.ctx, c.hkv, c.d}, kv),
                     tensor_of(*p.cpu, DType::bf16, {c.ctx, c.hkv, c.d}, vv), oc, ap);
    const Tensor q = gpu_f32(*p.gpu, {1, c.hq, c.d}, qv), k = tensor_of(*p.gpu, DType::bf16, {c.ctx, c.hkv, c.d}, kv),
                 v = tensor_of(*p.gpu, DType::bf16, {c.ctx, c.hkv, c.d}, vv);
    Tensor og = gpu_f32(*p.gpu, {1, c.hq, c.d}, {}), of = gpu_f32(*p.gpu, {1, c.hq, c.d}, {});
    p.gpu->attention(q, k, v, og, ap);
    {
      const ScopedEnv fma("SLUICE_CUDA_ATTENTION_MMA", "0");
      p.gpu->attention(q, k, v, of, ap);
    }
    const std::string what = str("tensor-core decode attention n_past=", c.n_past, " ctx=", c.ctx, " hq=", c.hq,
                                 " hkv=", c.hkv, " d=", c.d, " window=", c.window);
    const std::vector<float> got = read_with_guard(*p.gpu, og), fma_out = read_with_guard(*p.gpu, of);
    expect_close(got, read(*p.cpu, oc), what.c_str());
    expect_close(got, std::vector<float>(fma_out.begin(), fma_out.begin() + static_cast<std::ptrdiff_t>(c.hq * c.d)),
                 (what + " against the FMA kernel").c_str());
    differs = differs || std::memcmp(got.data(), fma_out.data(), got.size() * sizeof(float)) != 0;
  }
  EXPECT_TRUE(differs) << "the tensor-core kernel gave the FMA kernel's bits in every case: did it run?";
}

// attention_inputs into bf16 caches: each row written is the rounding (to nearest even) of
// the f32 key the same launch leaves in k, and the value given, bit for bit; the rows not
// written keep their bits; and the caches are the CPU's (its f32 keys rounded) within the
// f32 bound. Rows from n_past and from a positions tensor.
TEST(CudaOps, AttentionInputsIntoBf16Caches) {
  Pair p;
  const int64_t nh = 8, nkv = 2, d = 128, ctx = 40, n_past = 9;
  for (int64_t n : {1, 5})
    for (bool at : {false, true}) {
      auto qv = random_vec(n * nh * d, 70), kv = random_vec(n * nkv * d, 71), vv = random_vec(n * nkv * d, 72);
      auto cv = random_vec(n * d / 2, 73), sv = random_vec(n * d / 2, 74), cache = random_vec(ctx * nkv * d, 75);
      HostTensor qw(DType::bf16, {d}, random_vec(d, 76)), kw(DType::bf16, {d}, random_vec(d, 77));
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(at ? 30 - 3 * i : n_past + i);
      auto run = [&](Backend& be, bool gpu) {
        auto t = [&](std::initializer_list<int64_t> shape, const std::vector<float>& v) {
          return gpu ? gpu_f32(be, shape, v) : cpu_f32(be, shape, v);
        };
        Tensor q = t({n, nh, d}, qv), k = t({n, nkv, d}, kv), v = t({n, nkv, d}, vv);
        Tensor kc = tensor_of(be, DType::bf16, {ctx, nkv, d}, cache), vc = tensor_of(be, DType::bf16, {ctx, nkv, d}, cache);
        Tensor positions;
        if (at) {
          positions = be.alloc(DType::i32, {n});
          be.from_host(positions, pos.data());
        }
        be.attention_inputs(q, k, v, gpu ? be.upload(qw.t) : qw.t, gpu ? be.upload(kw.t) : kw.t, 1e-6f,
                            t({n, d / 2}, cv), t({n, d / 2}, sv), d, false, kc, vc, n_past, positions);
        return std::vector<Tensor>{k, kc, vc};
      };
      auto c = run(*p.cpu, false);
      auto g = run(*p.gpu, true);
      const std::string what = str("attention_inputs into bf16 caches n=", n, at ? " at" : "");
      const std::vector<float> k_gpu = read(*p.gpu, g[0]), kc_gpu = read_f32(*p.gpu, g[1]), vc_gpu = read_f32(*p.gpu, g[2]);
      std::vector<float> kc_want = read_f32(*p.cpu, tensor_of(*p.cpu, DType::bf16, {ctx, nkv, d}, cache));
      std::vector<float> vc_want = kc_want;
      const int64_t row = nkv * d;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < row; ++e) {
          const size_t at_e = static_cast<size_t>(pos[static_cast<size_t>(i)] * row + e), src = static_cast<size_t>(i * row + e);
          kc_want[at_e] = bf16_to_f32(f32_to_bf16(k_gpu[src]));
          vc_want[at_e] = bf16_to_f32(f32_to_bf16(vv[src]));
        }
      EXPECT_EQ(0, std::memcmp(kc_gpu.data(), kc_want.data(), kc_want.size() * sizeof(float))) << what << " k cache";
      EXPECT_EQ(0, std::memcmp(vc_gpu.data(), vc_want.data(), vc_want.size() * sizeof(float))) << what << " v cache";
      expect_close(kc_gpu, read_f32(*p.cpu, c[1]), (what + " k cache vs cpu").c_str());
      expect_close(vc_gpu, read_f32(*p.cpu, c[2]), (what + " v cache vs cpu").c_str());
    }
}

TEST(CudaOps, ConcatRowsKeepsEachPartsProduct) {
  Pair p;
  for (DType wt : {DType::bf16, DType::q8, DType::q4}) {
    const int64_t k = 256;
    const int64_t rows[3] = {96, 32, 32};
    std::vector<Tensor> parts;
    std::vector<std::vector<float>> values;
    std::vector<HostTensor> bf;
    std::vector<std::vector<uint8_t>> qdata, qscales;
    for (int i = 0; i < 3; ++i) {
      values.push_back(random_vec(rows[i] * k, 50 + i, 0.05f));
      if (wt == DType::bf16) {
        bf.emplace_back(wt, std::initializer_list<int64_t>{rows[i], k}, values.back());
        parts.push_back(p.gpu->upload(bf.back().t));
      } else {
        qdata.emplace_back(static_cast<size_t>(rows[i] * quant_row_bytes(wt, k)));
        qscales.emplace_back(static_cast<size_t>(rows[i] * quant_scale_row_bytes(wt, k)));
        for (int64_t r = 0; r < rows[i]; ++r)
          quantize_row(wt, values.back().data() + r * k, k, qdata.back().data() + r * quant_row_bytes(wt, k),
                       qscales.back().data() + r * quant_scale_row_bytes(wt, k));
        Tensor h(wt, {rows[i], k}, qdata.back().data());
        h.scales = qscales.back().data();
        parts.push_back(p.gpu->upload(h));
      }
    }
    Tensor all = p.gpu->concat_rows(parts);
    ASSERT_FALSE(all.empty());
    ASSERT_EQ(all.rows(), 160);
    auto xv = random_vec(k, 55);
    Tensor x = gpu_f32(*p.gpu, {1, k}, xv);
    Tensor y_all = gpu_f32(*p.gpu, {1, 160}, {});
    p.gpu->matmul(x, all, y_all);
    const std::vector<float> got = read(*p.gpu, y_all);
    int64_t at = 0;
    for (int i = 0; i < 3; ++i) {
      Tensor y = gpu_f32(*p.gpu, {1, rows[i]}, {});
      p.gpu->matmul(x, parts[static_cast<size_t>(i)], y);
      const std::vector<float> want = read(*p.gpu, y);
      for (int64_t r = 0; r < rows[i]; ++r)
        EXPECT_EQ(got[static_cast<size_t>(at + r)], want[static_cast<size_t>(r)]) << dtype_name(wt) << " part " << i;
      at += rows[i];
    }
  }
}

TEST(CudaOps, DecodeAttentionSplitOverTheContext) {
  // One query row (attention_decode.cu): query heads per kv head 1 (the per-head kernel) and
  // 2, 3, 4, 8, 16, 24 (the grouped-query kernel: stages of one or more chunks staged ahead,
  // one, two or four heads a warp), both followed by the merge launch where there are several
  // splits; head dims 64, 128, 256; capacities far above the position (many splits, most
  // empty) and at it; sliding windows inside one chunk and across splits. Cache
  // positions past the query hold NaN: a kernel that reads them, even masked (0 * NaN), fails.
  Pair p;
  struct Case {
    int64_t hq, hkv, d, n_past, ctx, window;
  };
  for (const Case c : {Case{4, 4, 128, 0, 1, 0}, Case{6, 2, 64, 37, 40, 0}, Case{8, 1, 128, 543, 576, 0},
                       Case{32, 4, 128, 200, 4096, 0}, Case{32, 4, 128, 3000, 4096, 0}, Case{16, 1, 128, 700, 800, 100},
                       Case{8, 2, 256, 300, 1000, 0}, Case{12, 3, 64, 9000, 9100, 4096}, Case{8, 8, 128, 5, 20000, 3},
                       Case{32, 4, 128, 8191, 8320, 0}, Case{32, 8, 128, 8000, 8320, 0}, Case{64, 4, 128, 4100, 8320, 0},
                       Case{48, 2, 64, 1000, 1100, 0}, Case{4, 2, 128, 77, 300, 0}, Case{32, 4, 256, 5000, 6000, 0},
                       Case{16, 2, 128, 0, 64, 0}, Case{32, 4, 128, 31, 32, 0}, Case{32, 4, 128, 999, 1024, 64}}) {
    auto qv = random_vec(c.hq * c.d, 21), kv = random_vec(c.ctx * c.hkv * c.d, 22), vv = random_vec(c.ctx * c.hkv * c.d, 23);
    for (int64_t i = (c.n_past + 1) * c.hkv * c.d; i < c.ctx * c.hkv * c.d; ++i) kv[i] = vv[i] = NAN;
    AttentionParams ap = attention_params(c.n_past, 0.09f, c.window);
    Tensor oc = p.cpu->alloc(DType::f32, {1, c.hq, c.d});
    p.cpu->attention(cpu_f32(*p.cpu, {1, c.hq, c.d}, qv), cpu_f32(*p.cpu, {c.ctx, c.hkv, c.d}, kv),
                     cpu_f32(*p.cpu, {c.ctx, c.hkv, c.d}, vv), oc, ap);
    Tensor og = gpu_f32(*p.gpu, {1, c.hq, c.d}, {});
    Tensor gq = gpu_f32(*p.gpu, {1, c.hq, c.d}, qv), gk = gpu_f32(*p.gpu, {c.ctx, c.hkv, c.d}, kv),
           gv = gpu_f32(*p.gpu, {c.ctx, c.hkv, c.d}, vv);
    // Twice: a launch must leave nothing (partials, scratch) that changes the next one.
    for (int rep = 0; rep < 2; ++rep) {
      p.gpu->attention(gq, gk, gv, og, ap);
      expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc),
                   ("decode attention hq=" + std::to_string(c.hq) + " hkv=" + std::to_string(c.hkv) +
                    " d=" + std::to_string(c.d) + " n_past=" + std::to_string(c.n_past) + " ctx=" +
                    std::to_string(c.ctx) + " window=" + std::to_string(c.window) + " rep=" + std::to_string(rep))
                       .c_str());
    }
  }
}

// Prefill attention on tensor cores (attention_flash.cu), launched directly, against the CPU
// reference and against the f32 per-row kernel on the same inputs. Query rows 65 (a tile and
// one row), 128, 200 and 1000; n_past 0 and 77 (tiles not aligned to positions); query heads
// per kv head 1, 4 and 8; head dims 64, 128, 256; window 0, 50 (< n: masks inside and across
// tiles) and 1 (only the diagonal). Cache positions past the last query hold NaN: a kernel
// that reads them, even masked (0 * NaN), fails.
struct FlashCase {
  int64_t n, n_past, hq, hkv, d, window;
  float scale;
  std::string name() const {
    return "n=" + std::to_string(n) + " n_past=" + std::to_string(n_past) + " hq=" + std::to_string(hq) +
           " hkv=" + std::to_string(hkv) + " d=" + std::to_string(d) + " window=" + std::to_string(window) +
           " scale=" + std::to_string(scale);
  }
};

std::vector<FlashCase> flash_cases() {
  std::vector<FlashCase> cases;
  for (int64_t d : {64, 128, 256})
    for (int64_t n : {65, 128, 200, 1000})
      for (int64_t n_past : {0, 77})
        for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {8, 1}})
          for (int64_t window : {0, 50}) cases.push_back({n, n_past, hq, hkv, d, window, 1.0f / std::sqrt(float(d))});
  // Peaky softmax (scores ~N(0, 16)) and the one-key window.
  cases.push_back({200, 77, 8, 2, 128, 0, 4.0f / std::sqrt(128.0f)});
  cases.push_back({130, 5, 4, 1, 64, 1, 0.125f});
  return cases;
}

struct FlashInputs {
  std::vector<float> q, k, v;
  int64_t ctx;
  FlashInputs(const FlashCase& c, uint32_t seed) : ctx(c.n_past + c.n + 5) {
    q = random_vec(c.n * c.hq * c.d, seed);
    k = random_vec(ctx * c.hkv * c.d, seed + 1);
    v = random_vec(ctx * c.hkv * c.d, seed + 2);
    for (int64_t i = (c.n_past + c.n) * c.hkv * c.d; i < ctx * c.hkv * c.d; ++i) k[i] = v[i] = NAN;
  }
};

cuda::AttentionParams flash_params(const FlashCase& c, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out) {
  return {.q = q.ptr<float>(), .k = k.ptr<float>(), .v = v.ptr<float>(), .out = out.ptr<float>(), .n = c.n,
          .hq = c.hq, .hkv = c.hkv, .d = c.d, .n_past = c.n_past, .scale = c.scale, .window = c.window};
}

// Runs a cuda launcher on the default stream between synchronizations (the backend's stream
// does not wait for the default stream, nor it for the backend's).
template <typename F>
void run_on_device(Backend& gpu, F&& launch) {
  gpu.synchronize();
  launch();
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaOps, FlashAttentionMatchesCpu) {
  Pair p;
  uint32_t seed = 100;
  for (const FlashCase& c : flash_cases()) {
    const FlashInputs in(c, seed += 3);
    Tensor oc = p.cpu->alloc(DType::f32, {c.n, c.hq, c.d});
    p.cpu->attention(cpu_f32(*p.cpu, {c.n, c.hq, c.d}, in.q), cpu_f32(*p.cpu, {in.ctx, c.hkv, c.d}, in.k),
                     cpu_f32(*p.cpu, {in.ctx, c.hkv, c.d}, in.v), oc, attention_params(c.n_past, c.scale, c.window));
    Tensor gq = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, in.q), gk = gpu_f32(*p.gpu, {in.ctx, c.hkv, c.d}, in.k),
           gv = gpu_f32(*p.gpu, {in.ctx, c.hkv, c.d}, in.v), og = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
    const cuda::AttentionParams ap = flash_params(c, gq, gk, gv, og);
    ASSERT_TRUE(cuda::attention_flash_supported(ap)) << c.name();
    run_on_device(*p.gpu, [&] { cuda::launch_attention_flash(ap, nullptr); });
    expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), ("flash attention " + c.name()).c_str());
  }
}

TEST(CudaOps, FlashAttentionMatchesRowsKernel) {
  // The same inputs through both CUDA kernels; then the flash kernel again with n_past read
  // from device memory (a captured graph's way), the host n_past set wrong on purpose.
  Pair p;
  uint32_t seed = 900;
  for (const FlashCase& c : flash_cases()) {
    const FlashInputs in(c, seed += 3);
    Tensor gq = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, in.q), gk = gpu_f32(*p.gpu, {in.ctx, c.hkv, c.d}, in.k),
           gv = gpu_f32(*p.gpu, {in.ctx, c.hkv, c.d}, in.v);
    Tensor o_rows = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {}), o_flash = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
    run_on_device(*p.gpu, [&] { cuda::launch_attention_rows(flash_params(c, gq, gk, gv, o_rows), nullptr); });
    run_on_device(*p.gpu, [&] { cuda::launch_attention_flash(flash_params(c, gq, gk, gv, o_flash), nullptr); });
    std::vector<float> rows = read(*p.gpu, o_rows);
    expect_close(read_with_guard(*p.gpu, o_flash), rows, ("flash vs rows " + c.name()).c_str());

    Tensor n_past_at = p.gpu->alloc(DType::i32, {1});
    const int32_t n_past32 = static_cast<int32_t>(c.n_past);
    p.gpu->from_host(n_past_at, &n_past32);
    Tensor o_dev = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
    cuda::AttentionParams ap = flash_params(c, gq, gk, gv, o_dev);
    ap.n_past = c.n_past + 12345;
    ap.n_past_dev = n_past_at.ptr<int32_t>();
    run_on_device(*p.gpu, [&] { cuda::launch_attention_flash(ap, nullptr); });
    expect_close(read_with_guard(*p.gpu, o_dev), rows, ("flash n_past_dev vs rows " + c.name()).c_str());
  }
}

TEST(CudaOps, AttentionEitherSideOfTheFlashThreshold) {
  // Through the backend: 63 rows (the per-row kernel), 64 and 65 (flash), d = 96 (no flash
  // instantiation: the per-row kernel at any n), all against the CPU.
  Pair p;
  for (auto [n, d] : {std::pair<int64_t, int64_t>{63, 128}, {64, 128}, {65, 64}, {300, 96}}) {
    const FlashCase c{n, 40, 8, 2, d, 0, 0.1f};
    const FlashInputs in(c, 77);
    Tensor oc = p.cpu->alloc(DType::f32, {c.n, c.hq, c.d});
    const AttentionParams ap = attention_params(c.n_past, c.scale, c.window);
    p.cpu->attention(cpu_f32(*p.cpu, {c.n, c.hq, c.d}, in.q), cpu_f32(*p.cpu, {in.ctx, c.hkv, c.d}, in.k),
                     cpu_f32(*p.cpu, {in.ctx, c.hkv, c.d}, in.v), oc, ap);
    Tensor og = gpu_f32(*p.gpu, {c.n, c.hq, c.d}, {});
    p.gpu->attention(gpu_f32(*p.gpu, {c.n, c.hq, c.d}, in.q), gpu_f32(*p.gpu, {in.ctx, c.hkv, c.d}, in.k),
                     gpu_f32(*p.gpu, {in.ctx, c.hkv, c.d}, in.v), og, ap);
    expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), ("backend attention " + c.name()).c_str());
  }
}

TEST(CudaOps, RowsAndMoeCombine) {
  Pair p;
  const int64_t V = 37, c = 19, n = 6, k = 3;
  auto tv = random_vec(V * c, 11);
  std::vector<int32_t> ids = {0, 36, 5, 5, 17, 2};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    HostTensor table(dt, {V, c}, tv);
    Tensor oc = p.cpu->alloc(DType::f32, {n, c}), og = gpu_f32(*p.gpu, {n, c}, {});
    p.cpu->get_rows(table.t, ids, oc);
    p.gpu->get_rows(p.gpu->upload(table.t), ids, og);
    expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), "get_rows");
  }
  auto ev = random_vec(n * k * c, 12);
  std::vector<float> w = {0.5f, 0.3f, 0.2f, 1, 0, 0, 0.1f, 0.1f, 0.8f, 0.4f, 0.4f, 0.2f, 0.7f, 0.2f, 0.1f, 0.33f, 0.33f, 0.34f};
  Tensor oc = p.cpu->alloc(DType::f32, {n, c}), og = gpu_f32(*p.gpu, {n, c}, {});
  p.cpu->moe_combine(cpu_f32(*p.cpu, {n * k, c}, ev), w, k, oc);
  p.gpu->moe_combine(gpu_f32(*p.gpu, {n * k, c}, ev), w, k, og);
  expect_close(read_with_guard(*p.gpu, og), read(*p.cpu, oc), "moe_combine");
  std::vector<int32_t> idx = {4, 0, 2};
  Tensor src_c = cpu_f32(*p.cpu, {n, c}, ev), src_g = gpu_f32(*p.gpu, {n, c}, ev);
  Tensor gc = p.cpu->alloc(DType::f32, {3, c}), gg = gpu_f32(*p.gpu, {3, c}, {});
  p.cpu->gather_rows(src_c, idx, gc);
  p.gpu->gather_rows(src_g, idx, gg);
  expect_close(read_with_guard(*p.gpu, gg), read(*p.cpu, gc), "gather_rows");
  p.cpu->scatter_rows(gc, idx, src_c);
  p.gpu->scatter_rows(gg, idx, src_g);
  expect_close(read_with_guard(*p.gpu, src_g), read(*p.cpu, src_c), "scatter_rows");
}

}  // namespace

namespace {

// A host matrix [m, k] of quantized kind q holding wv, rows quantized by core/quant.
struct QuantizedMatrix {
  std::vector<uint8_t> data, scales;
  Tensor t;
  QuantizedMatrix(DType q, const std::vector<float>& wv, int64_t m, int64_t k)
      : data(m * quant_row_bytes(q, k)), scales(m * quant_scale_row_bytes(q, k)), t(q, {m, k}, nullptr) {
    for (int64_t r = 0; r < m; ++r)
      quantize_row(q, wv.data() + r * k, k, data.data() + r * quant_row_bytes(q, k),
                   scales.data() + r * quant_scale_row_bytes(q, k));
    t.data = data.data();
    t.scales = scales.data();
  }
};

// MXFP4 weights through the generic products: decode matvec (n <= 8), its batch passes, and
// the tiled prefill kernel (n = 300); k a multiple of the group (the vectorized path; 2880 is
// gpt-oss's width) and not (100: the scalar path).
TEST(CudaOps, MatmulMxfp4) {
  Pair p;
  const DType q = DType::mxfp4;
  for (int64_t n : {1, 2, 5, 19, 300})
    for (auto [m, k] : {std::pair<int64_t, int64_t>{7, 32}, {33, 64}, {64, 2880}, {5, 100}, {1100, 256}}) {
      auto wv = random_vec(m * k, 31), xv = random_vec(n * k, 32);
      const QuantizedMatrix qm(q, wv, m, k);
      const Tensor& w = qm.t;
      Tensor yg = gpu_f32(*p.gpu, {n, m}, {});
      Tensor yc = p.cpu->alloc(DType::f32, {n, m});
      p.cpu->matmul(cpu_f32(*p.cpu, {n, k}, xv), w, yc);
      p.gpu->matmul(gpu_f32(*p.gpu, {n, k}, xv), p.gpu->upload(w), yg);
      expect_close(read_with_guard(*p.gpu, yg), read(*p.cpu, yc),
                   ("matmul mxfp4 n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k)).c_str());
    }
}

// Quantized weights: the GPU dequantizes exactly as core/quant.cpp; only sums reorder.
TEST(CudaOps, MatmulQuantized) {
  Pair p;
  for (DType q : {DType::q8, DType::q4, DType::q2})
    for (int64_t n : {1, 2, 5, 19})
      for (auto [m, k] : {std::pair<int64_t, int64_t>{7, 24}, {33, 40}, {64, 256}, {5, 100}, {8200, 128}, {77, 512},
                          {1100, 256}}) {
        auto wv = random_vec(m * k, 21), xv = random_vec(n * k, 22);
        const QuantizedMatrix qm(q, wv, m, k);
        const Tensor& w = qm.t;
        Tensor yc = p.cpu->alloc(DType::f32, {n, m});
        p.cpu->matmul(cpu_f32(*p.cpu, {n, k}, xv), w, yc);
        Tensor yg = gpu_f32(*p.gpu, {n, m}, {});
        p.gpu->matmul(gpu_f32(*p.gpu, {n, k}, xv), p.gpu->upload(w), yg);
        expect_close(read_with_guard(*p.gpu, yg), read(*p.cpu, yc),
                     ("matmul " + std::string(dtype_name(q)) + " n=" + std::to_string(n) + " k=" + std::to_string(k)).c_str());
      }
}

}  // namespace
