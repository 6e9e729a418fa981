// GPU parity: every fixture on the CUDA backend matches transformers' logits and reproduces
// the greedy continuation. The decoder fixtures within 1e-3 (the CUDA issue's bound, f32
// activations); the hybrid fixtures (Gated DeltaNet, QSA, hyper-connections, PLE) within the
// CPU parity's 1e-4 (tests/models/parity_test.cpp), teacher-forced over the prompt and over
// prompt + continuation, and also decoded token by token through the recurrent state after an
// uneven chunked prefill, and again after a state reset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <span>

#include "tests/models/farm_util.h"
#include "tests/models/fixture_util.h"
#include "engine/generator.h"
#include "format/npy.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaParity, LogitsAndGreedyMatchTransformers) {
  auto backend = make_cuda_backend(0);
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const int64_t V = m.model->info().n_vocab;
  NpyArray want = read_npy(fixture_dir(GetParam()) / "logits_full.npy");
  auto state = m.model->new_state(static_cast<int64_t>(ids.size()));
  std::vector<float> got(ids.size() * V);
  m.model->forward(ids, *state, got, true);
  float diff = max_abs_diff(got, want.data);
  std::printf("cuda %s: max |logit - reference| = %.3g\n", GetParam().c_str(), diff);
  EXPECT_LE(diff, 1e-3f);
  GenerateOptions opt;
  opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
  opt.sampling.temperature = 0;
  std::vector<int32_t> cont;
  Generator(*m.model).generate(ref.prompt_ids, opt, [&](int32_t id) {
    cont.push_back(id);
    return true;
  });
  EXPECT_EQ(cont, ref.continuation_ids);
}

// A bf16 KV cache (--kv-cache bf16) on CUDA against the CPU backend's bf16 cache: the same
// rounded keys and values (each rounded once, when written), read by every CUDA attention
// kernel (the prefill rows and tensor-core kernels teacher-forced; the split decode kernels
// token by token after an uneven chunked prefill), within the f32 CUDA bound of the CPU's
// logits; and the greedy continuation the CPU's bf16 cache gives.
TEST_P(CudaParity, Bf16KvCacheMatchesTheCpuBf16Cache) {
  auto cpu = make_cpu_backend(), gpu = make_cuda_backend(0);
  cpu->set_kv_dtype(DType::bf16);
  gpu->set_kv_dtype(DType::bf16);
  LoadedModel mc = load_model(fixture_dir(GetParam()), *cpu), mg = load_model(fixture_dir(GetParam()), *gpu);
  FixtureReference ref = read_reference(GetParam());
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const int64_t V = mc.model->info().n_vocab, n = static_cast<int64_t>(ids.size());
  std::vector<float> want(n * V), forced(n * V), decoded(n * V);
  mc.model->forward(ids, *mc.model->new_state(n), want, true);
  mg.model->forward(ids, *mg.model->new_state(n), forced, true);
  decode_in_chunks(*mg.model, ids, ref.prompt_ids.size(), decoded);
  const float d_forced = max_abs_diff(forced, want), d_decoded = max_abs_diff(decoded, want);
  std::printf("cuda %s bf16 KV cache: max |logit - cpu bf16| = %.3g teacher-forced, %.3g decoded\n",
              GetParam().c_str(), d_forced, d_decoded);
  EXPECT_LE(d_forced, 1e-3f);
  EXPECT_LE(d_decoded, 1e-3f);
  auto greedy = [&](Model& model) {
    GenerateOptions opt;
    opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
    opt.sampling.temperature = 0;
    std::vector<int32_t> cont;
    Generator(model).generate(ref.prompt_ids, opt, [&](int32_t id) {
      cont.push_back(id);
      return true;
    });
    return cont;
  };
  EXPECT_EQ(greedy(*mg.model), greedy(*mc.model));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

// The CPU parity's bound for every family (tests/models/parity_test.cpp).
constexpr float kHybridLogitTolerance = 1e-4f;

class CudaHybridParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHybridParity, LogitsGreedyAndCachedDecodeMatchTransformers) {
  auto backend = make_cuda_backend(0);
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  const int64_t V = m.model->info().n_vocab;
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  // Teacher-forced, one pass each.
  for (const auto& [file, with_continuation] : {std::pair{"logits_prompt.npy", false}, {"logits_full.npy", true}}) {
    const size_t len = with_continuation ? ids.size() : ref.prompt_ids.size();
    NpyArray want = read_npy(fixture_dir(GetParam()) / file);
    ASSERT_EQ(want.shape, (std::vector<int64_t>{static_cast<int64_t>(len), V})) << file;
    auto state = m.model->new_state(static_cast<int64_t>(len));
    std::vector<float> got(len * V);
    m.model->forward(std::span(ids).first(len), *state, got, true);
    const float diff = max_abs_diff(got, want.data);
    std::printf("cuda %s %s: max |logit - reference| = %.3g\n", GetParam().c_str(), file, diff);
    EXPECT_LE(diff, kHybridLogitTolerance) << GetParam() << " " << file;
  }
  // Prefill in uneven chunks (5, 1, the rest of the prompt), then one token at a time: the
  // delta rule's decode path, the conv and PLE states, QSA's block keys carried across calls.
  // Then reset and do it again: the state must be as new.
  NpyArray want = read_npy(fixture_dir(GetParam()) / "logits_full.npy");
  auto state = m.model->new_state(n);
  for (int round = 0; round < 2; ++round) {
    if (round == 1) state->reset();
    std::vector<float> got(n * V), row(V);
    size_t pos = 0;
    for (size_t chunk : {size_t{5}, size_t{1}, ref.prompt_ids.size() - 6}) {
      std::vector<float> part(chunk * V);
      m.model->forward(std::span(ids).subspan(pos, chunk), *state, part, true);
      std::copy(part.begin(), part.end(), got.begin() + pos * V);
      pos += chunk;
    }
    for (; pos < ids.size(); ++pos) {
      m.model->forward(std::span(ids).subspan(pos, 1), *state, row, false);
      std::copy(row.begin(), row.end(), got.begin() + pos * V);
    }
    const float diff = max_abs_diff(got, want.data);
    std::printf("cuda %s decode through the state%s: max |logit - reference| = %.3g\n", GetParam().c_str(),
                round ? " after reset" : "", diff);
    EXPECT_LE(diff, kHybridLogitTolerance) << GetParam() << (round ? " after reset" : "");
  }
  // Greedy generation reproduces transformers' continuation.
  GenerateOptions opt;
  opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
  opt.sampling.temperature = 0;
  std::vector<int32_t> cont;
  Generator(*m.model).generate(ref.prompt_ids, opt, [&](int32_t id) {
    cont.push_back(id);
    return true;
  });
  EXPECT_EQ(cont, ref.continuation_ids) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaHybridParity, ::testing::ValuesIn(hybrid_fixtures()),
                         [](const auto& info) { return info.param; });

// The fixture farm (tests/models/farm_test.cpp) on CUDA: every position of every config, one
// teacher-forced pass and a chunked prefill + token-by-token decode, within the CPU's 1e-4.
class CudaFarm : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFarm, EveryPositionMatchesTransformers) {
  auto backend = make_cuda_backend(0);
  expect_farm_entry_matches(*backend, GetParam(), kHybridLogitTolerance, "cuda");
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaFarm, ::testing::ValuesIn(farm_entries()),
                         [](const auto& info) { return info.param; });

}  // namespace
