// DeepSeek-V3 / Kimi K2, GLM-4.5 and MiniMax-M2 on the CUDA backend:
//  - the device's group-limited sigmoid top-k (router_group_topk.cu) chooses the same experts
//    with the same weights as route_topk, bit for bit, from the same logits and biases;
//  - multi-head latent attention's ops against the CPU reference: attention over the latent
//    cache (one sequence, a device position, a batch step's rows with caches of their own; f32
//    and bf16 caches) and the per-head products;
//  - every giant fixture against transformers with an f32 KV cache, teacher-forced (the
//    expanded prefill on the attention kernels) and decoded through the latent cache (the
//    absorbed decode kernel), within the CUDA decoder bound of 1e-3, the greedy continuation
//    equal; a q4 pack against the CPU's run of it; routed on the host behind
//    SLUICE_CUDA_HOST_ROUTED=1; the decode step replayed from a graph equal to the eager one;
//    streamed from a preloaded host tier through top_k slots as the resident model.
// Streaming against the CPU streamer: cuda_streaming_test.cpp's GiantFamiliesSameRoutingAndTokensAsTheCpu
// (and GroupedPrefillIsTheResidentPrefillBitForBit, which cuda_expert_fixtures() feeds them to).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/router_group_topk.h"
#include "core/dtype.h"
#include "tests/gpu/cuda_family_checks.h"
#include "experts/routing.h"

using namespace sluice;
using namespace sluice::test;

namespace {

std::vector<float> random_vec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// A tensor of `be` holding values (f32, or rounded to bf16 on the host).
Tensor upload(Backend& be, const std::vector<float>& values, std::initializer_list<int64_t> shape,
              DType dtype = DType::f32) {
  Tensor t = be.alloc(dtype, shape);
  if (dtype == DType::f32) {
    be.from_host(t, values.data());
    return t;
  }
  std::vector<uint16_t> half(values.size());
  for (size_t i = 0; i < values.size(); ++i) half[i] = f32_to_bf16(values[i]);
  be.from_host(t, half.data());
  return t;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  be.to_host(t, out.data());
  return out;
}

// Normalized squared error of got against want.
double nse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / std::max(den, 1e-30);
}

}  // namespace

TEST(CudaGiant, GroupRouterTopkIsRouteTopkBitForBit) {
  struct Case {
    int64_t n, E, k, groups, keep;
    bool norm, ties;
  };
  auto gpu = make_cuda_backend(0);
  for (const Case& c : {Case{7, 16, 4, 4, 2, true, false}, {5, 256, 8, 8, 4, true, false}, {3, 384, 8, 1, 1, true, false},
                        {9, 160, 8, 1, 1, true, true}, {4, 64, 6, 8, 3, false, false}, {2, 12, 3, 3, 2, false, true},
                        {33, 16, 4, 2, 1, true, false}, {6, 512, 32, 16, 16, true, false}}) {
    const std::string what = str("E=", c.E, " k=", c.k, " groups ", c.groups, " keep ", c.keep, c.norm ? " norm" : "",
                                 c.ties ? " ties" : "");
    std::vector<float> logits = random_vec(c.n * c.E, 11 + static_cast<uint32_t>(c.E), 2.0f);
    std::vector<float> bias = random_vec(c.E, 13 + static_cast<uint32_t>(c.E), 0.1f);
    if (c.ties)  // equal choice values across groups and experts: the lower group / id first
      for (float& l : logits) l = std::round(l);
    RouterSpec spec;
    spec.n_expert = c.E;
    spec.n_expert_used = c.k;
    spec.norm_topk_prob = c.norm;
    spec.scoring = RouterScoring::sigmoid_grouped;
    spec.grouped = GroupedRouting{c.groups, c.keep, 2.5f, 1e-20f};
    for (bool with_bias : {false, true}) {
      const Routing want = route_topk(spec, logits, c.n, with_bias ? std::span<const float>(bias) : std::span<const float>());
      Tensor dl = upload(*gpu, logits, {c.n, c.E}), db = upload(*gpu, bias, {c.E});
      Tensor ids = gpu->alloc(DType::i32, {c.n * c.k}), w = gpu->alloc(DType::f32, {c.n * c.k});
      const cuda::RouterGroupParams g{c.groups, c.keep, 2.5f, 1e-20f, with_bias ? db.ptr<float>() : nullptr};
      // On the backend's stream, which its to_host orders after (the legacy default stream is not).
      cuda::launch_router_group_topk(dl.ptr<float>(), c.n, c.E, c.k, c.norm, g, ids.ptr<int32_t>(), w.ptr<float>(),
                                     dynamic_cast<CudaBackend&>(*gpu).stream());
      std::vector<int32_t> got_ids(static_cast<size_t>(c.n * c.k));
      gpu->to_host(ids, got_ids.data());
      const std::vector<float> got_w = download(*gpu, w);
      EXPECT_EQ(got_ids, want.ids) << what << (with_bias ? " bias" : "");
      EXPECT_EQ(std::memcmp(got_w.data(), want.weights.data(), got_w.size() * sizeof(float)), 0)
          << what << (with_bias ? " bias" : "") << ": weights differ from route_topk's bits";
    }
  }
}

// attention_latent on CUDA against the CPU's (attention() over the cache as one kv head): one
// sequence at host and device positions, and a batch step's rows with caches of their own.
TEST(CudaGiant, LatentAttentionMatchesTheCpu) {
  auto cpu = make_cpu_backend(), gpu = make_cuda_backend(0);
  struct Case {
    int64_t n, H, dk, dv, n_ctx, n_past;
  };
  for (DType kv : {DType::f32, DType::bf16})
    for (const Case& c : {Case{1, 4, 40, 32, 64, 20}, {5, 4, 40, 32, 64, 7}, {1, 128, 576, 512, 3000, 2500},
                          {3, 16, 576, 512, 600, 100}, {1, 20, 72, 64, 40, 0}, {2, 128, 576, 512, 70, 67}}) {
      const std::string what = str(dtype_name(kv), " n=", c.n, " H=", c.H, " dk=", c.dk, " n_ctx=", c.n_ctx, " at ", c.n_past);
      const std::vector<float> q = random_vec(c.n * c.H * c.dk, 3, 0.3f), cache = random_vec(c.n_ctx * c.dk, 5);
      std::vector<float> want, got;
      for (Backend* be : {cpu.get(), gpu.get()}) {
        const Tensor tq = upload(*be, q, {c.n, c.H, c.dk}), tc = upload(*be, cache, {c.n_ctx, 1, c.dk}, kv);
        Tensor out = be->alloc(DType::f32, {c.n, c.H, c.dv});
        AttentionParams p;
        p.n_past = c.n_past;
        p.scale = 0.07f;
        be->attention_latent(tq, tc, out, p);
        (be == cpu.get() ? want : got) = download(*be, out);
      }
      EXPECT_LE(nse(got, want), 1e-6) << what;
      // The position read on the device (a captured step's).
      const Tensor tq = upload(*gpu, q, {c.n, c.H, c.dk}), tc = upload(*gpu, cache, {c.n_ctx, 1, c.dk}, kv);
      Tensor out = gpu->alloc(DType::f32, {c.n, c.H, c.dv}), pos = gpu->alloc(DType::i32, {1});
      const int32_t at = static_cast<int32_t>(c.n_past);
      gpu->from_host(pos, &at);
      AttentionParams p;
      p.n_past = 0;  // ignored: n_past_at holds the position
      p.n_past_at = pos;
      p.scale = 0.07f;
      gpu->attention_latent(tq, tc, out, p);
      EXPECT_LE(nse(download(*gpu, out), want), 1e-6) << what << " (device position)";
    }
  // A batch step: row b against its own cache at its own position.
  for (DType kv : {DType::f32, DType::bf16}) {
    const int64_t B = 3, H = 128, dk = 576, dv = 512;
    const std::vector<int64_t> n_ctx = {50, 700, 9}, n_past = {49, 300, 0};
    const std::vector<float> q = random_vec(B * H * dk, 9, 0.3f);
    std::vector<float> want, got;
    for (Backend* be : {cpu.get(), gpu.get()}) {
      std::vector<Tensor> caches;
      for (int64_t b = 0; b < B; ++b)
        caches.push_back(upload(*be, random_vec(n_ctx[b] * dk, 20 + static_cast<uint32_t>(b)), {n_ctx[b], 1, dk}, kv));
      const Tensor tq = upload(*be, q, {B, H, dk});
      Tensor out = be->alloc(DType::f32, {B, H, dv});
      be->attention_latent_rows(tq, out, Backend::RowCaches{caches, caches, n_past, {}}, 0.05f);
      (be == cpu.get() ? want : got) = download(*be, out);
    }
    EXPECT_LE(nse(got, want), 1e-6) << dtype_name(kv) << " batch rows";
  }
}

TEST(CudaGiant, MatmulHeadsMatchesTheCpu) {
  auto cpu = make_cpu_backend(), gpu = make_cuda_backend(0);
  for (DType wt : {DType::f32, DType::bf16})
    for (int64_t n : {1, 3, 8, 20}) {
      const int64_t H = 16, k = 128, m = 72;
      const std::vector<float> x = random_vec(n * H * k, 1), w = random_vec(H * m * k, 2, 0.1f);
      std::vector<float> want, got;
      for (Backend* be : {cpu.get(), gpu.get()}) {
        Tensor y = be->alloc(DType::f32, {n, H, m});
        be->matmul_heads(upload(*be, x, {n, H, k}), upload(*be, w, {H * m, k}, wt), y);
        (be == cpu.get() ? want : got) = download(*be, y);
      }
      EXPECT_LE(nse(got, want), 1e-6) << dtype_name(wt) << " n=" << n;
    }
}

namespace {

class CudaGiantFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGiantFamily, MatchesTransformersTeacherForcedDecodedAndGreedy) {
  expect_cuda_matches_transformers(GetParam());
}

TEST_P(CudaGiantFamily, Q4PackMatchesTheCpu) { expect_cuda_pack_matches_the_cpu(GetParam(), DType::q4); }

TEST_P(CudaGiantFamily, HostRoutedExpertsBehindTheirSwitch) {
  const HostRouted host_routed;
  expect_cuda_matches_transformers(GetParam());
}

// The decode step replayed from its graph (the latent cache's append and the absorbed
// attention read the position on the device) gives the eager step's logits bit for bit.
TEST_P(CudaGiantFamily, GraphReplayEqualsEagerDecode) {
  const FixtureReference ref = read_reference(GetParam());
  std::vector<std::vector<float>> runs;
  for (const char* graphs : {"0", "1"}) {
    const ScopedEnv env("SLUICE_CUDA_GRAPHS", graphs);
    auto gpu = make_cuda_backend(0);
    ASSERT_EQ(gpu->graphs_enabled(), graphs[0] == '1');
    LoadedModel m = load_model(fixture_dir(GetParam()), *gpu);
    const int64_t V = m.model->info().n_vocab;
    auto state = m.model->new_state(static_cast<int64_t>(ref.prompt_ids.size() + ref.continuation_ids.size()));
    std::vector<float> logits(static_cast<size_t>(V)), all;
    m.model->forward(ref.prompt_ids, *state, logits, false);
    for (int32_t id : ref.continuation_ids) {
      m.model->forward(std::span<const int32_t>(&id, 1), *state, logits, false);
      all.insert(all.end(), logits.begin(), logits.end());
    }
    runs.push_back(all);
  }
  EXPECT_EQ(floats_differing(runs[0], runs[1]), 0u) << GetParam();
}

// Streamed through top_k slots from a preloaded host tier: the resident model's greedy
// tokens and its logits within the bound.
TEST_P(CudaGiantFamily, StreamedFromTheHostTierAsResident) {
  auto gpu = make_cuda_backend(0);
  gpu->set_kv_dtype(DType::f32);
  const std::vector<int32_t> ids = full_ids(GetParam());
  const auto& pack = fixture_pack(GetParam());
  LoadedModel resident = load_model(pack, *gpu, {DType::q4});
  const int64_t k = resident.model->info().n_expert_used, V = resident.model->info().n_vocab;
  LoadOptions lo = streamed(DType::q4, static_cast<int32_t>(k));
  std::shared_ptr<Pack> p = Pack::open(pack, false);
  lo.streaming->host_cache_bytes = p->manifest().n_records() * p->kind(DType::q4).record_stride;
  lo.streaming->host_cache_preload = true;
  LoadedModel m = load_model(pack, *gpu, lo);
  std::vector<float> want(ids.size() * V), got(ids.size() * V);
  resident.model->forward(ids, *resident.model->new_state(static_cast<int64_t>(ids.size())), want, true);
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(ids.size())), got, true);
  EXPECT_LE(max_abs_diff(got, want), kCudaLogitTolerance);
  const std::vector<int32_t> prompt = read_reference(GetParam()).prompt_ids;
  EXPECT_EQ(greedy(*m.model, prompt, 8), greedy(*resident.model, prompt, 8));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGiantFamily, ::testing::ValuesIn(giant_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
