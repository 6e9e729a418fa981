// Parity against transformers: for every fixture, the logits of a teacher-forced pass over
// the prompt and over prompt + continuation match the reference within 1e-4 max-abs (f32
// compute; the reference is f32 on the CPU), greedy decoding reproduces the reference
// continuation exactly, and decoding token by token through the KV cache reproduces the
// teacher-forced logits of prompt + continuation.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "engine/generator.h"
#include "tests/models/fixture_util.h"
#include "format/npy.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

// f32 kernels reorder sums differently from PyTorch; observed differences are ~1e-6 on
// logits of magnitude ~1-10. The issue fixes the bound at 1e-4.
constexpr float kLogitTolerance = 1e-4f;

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, TeacherForcedLogitsMatchTransformers) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  const int64_t V = m.model->info().n_vocab;
  for (const auto& [file, with_continuation] : {std::pair{"logits_prompt.npy", false}, {"logits_full.npy", true}}) {
    std::vector<int32_t> ids = ref.prompt_ids;
    if (with_continuation) ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
    NpyArray want = read_npy(fixture_dir(GetParam()) / file);
    ASSERT_EQ(want.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), V})) << file;
    auto state = m.model->new_state(static_cast<int64_t>(ids.size()));
    std::vector<float> got(ids.size() * V);
    m.model->forward(ids, *state, got, true);
    float diff = max_abs_diff(got, want.data);
    std::printf("%s %s: max |logit - reference| = %.3g\n", GetParam().c_str(), file, diff);
    EXPECT_LE(diff, kLogitTolerance) << GetParam() << " " << file;
  }
}

TEST_P(Parity, GreedyContinuationMatchesTransformers) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  GenerateOptions opt;
  opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
  opt.sampling.temperature = 0;
  std::vector<int32_t> got;
  Generator(*m.model).generate(ref.prompt_ids, opt, [&](int32_t id) {
    got.push_back(id);
    return true;
  });
  EXPECT_EQ(got, ref.continuation_ids) << GetParam();
}

TEST_P(Parity, KvCacheDecodeReproducesTeacherForcedLogits) {
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const int64_t V = m.model->info().n_vocab, n = static_cast<int64_t>(ids.size());
  NpyArray want = read_npy(fixture_dir(GetParam()) / "logits_full.npy");
  // Prefill the prompt in uneven chunks, then one token at a time.
  std::vector<float> got(n * V);
  decode_in_chunks(*m.model, ids, ref.prompt_ids.size(), got);
  float diff = max_abs_diff(got, want.data);
  std::printf("%s decode through the cache: max |logit - reference| = %.3g\n", GetParam().c_str(), diff);
  EXPECT_LE(diff, kLogitTolerance) << GetParam();
}

// A bf16 KV cache (--kv-cache bf16): decoding through the cache in uneven chunks gives the
// teacher-forced pass's logits bit for bit (the CPU's attention does not depend on the
// number of rows, and every key and value is rounded once, when written), and both stay near
// the reference (the cache rounding is the only change: printed, bounded by kBf16KvTolerance).
constexpr float kBf16KvTolerance = 2e-2f;
// The gpt-oss fixtures scale their gate/up weights by 8 so that the clamped SwiGLU binds
// (tools/make_fixtures.py), which amplifies any perturbation of an expert's input: int8
// experts alone move their logits by up to 1.1 (pack_parity_test's int8 run). The cache's
// rounding moves them by 0.038 (the other decoder fixtures: 0.009 to 0.015): bounded at 5e-2.
constexpr float kBf16KvToleranceAmplified = 5e-2f;
// The bound holds while the rounding changes no routing decision. The Gemma 4 fixtures'
// routers have top-k margins of 3.5e-4 to 3.8e-4 and their attention is unscaled (scale 1 over
// normed q and k: peaky softmaxes), so the cache's rounding flips routing decisions there
// (counted below, against the f32 cache's); a flipped expert moves logits by O(1), which is a
// property of the seed, not of the cache: for those the logits are reported, and the bitwise
// decode = teacher forcing still asserted. Two fixtures of the group-limited sigmoid routers
// (deepseek_v3_plain, minimax_m2: top-k margins of 6.9e-4 and 8.6e-4 on the sigmoid + bias
// scale) see 4 flips each under the cache's rounding, which move their logits less than the
// bound: for them the bound is asserted all the same.

// Every routing decision of a teacher-forced pass, in order (layer, row, rank: expert id).
std::vector<int32_t> routing_of(const std::string& fixture, DType kv, const std::vector<int32_t>& ids,
                                std::vector<float>* logits = nullptr) {
  auto backend = make_cpu_backend();
  backend->set_kv_dtype(kv);
  LoadedModel m = load_model(fixture_dir(fixture), *backend);
  std::vector<int32_t> decisions;
  m.model->set_routing_observer([&](const RoutingEvent& ev) {
    decisions.insert(decisions.end(), ev.routing->ids.begin(), ev.routing->ids.end());
  });
  std::vector<float> out(ids.size() * static_cast<size_t>(m.model->info().n_vocab));
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(ids.size())), out, true);
  if (logits) *logits = std::move(out);
  return decisions;
}

TEST_P(Parity, Bf16KvCacheDecodeEqualsTeacherForcedBitwise) {
  auto backend = make_cpu_backend();
  backend->set_kv_dtype(DType::bf16);
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  FixtureReference ref = read_reference(GetParam());
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const int64_t V = m.model->info().n_vocab, n = static_cast<int64_t>(ids.size());
  std::vector<float> forced(n * V), got(n * V);
  auto whole = m.model->new_state(n);
  m.model->forward(ids, *whole, forced, true);
  decode_in_chunks(*m.model, ids, ref.prompt_ids.size(), got);
  const std::vector<int32_t> routed_f32 = routing_of(GetParam(), DType::f32, ids),
                             routed_bf16 = routing_of(GetParam(), DType::bf16, ids);
  ASSERT_EQ(routed_f32.size(), routed_bf16.size());
  size_t flips = 0;
  for (size_t i = 0; i < routed_f32.size(); ++i) flips += routed_f32[i] != routed_bf16[i];
  NpyArray want = read_npy(fixture_dir(GetParam()) / "logits_full.npy");
  const float diff = max_abs_diff(forced, want.data);
  // The hybrid families' gated attention keeps f32 caches (their context is half the f32
  // one's bytes only where the bf16 cache is taken): the f32 checks of the tests above apply.
  auto f32_backend = make_cpu_backend();
  const bool bf16_taken =
      m.model->context_bytes(n) < load_model(fixture_dir(GetParam()), *f32_backend).model->context_bytes(n);
  std::printf("%s bf16 KV cache (%s): max |logit - reference| = %.3g\n", GetParam().c_str(),
              bf16_taken ? "taken" : "f32 kept", diff);
  if (bf16_taken) {
    EXPECT_EQ(0, std::memcmp(got.data(), forced.data(), got.size() * sizeof(float))) << GetParam();
    const bool amplified = GetParam().rfind("gpt_oss", 0) == 0;
    if (flips == 0) {
      EXPECT_LE(diff, amplified ? kBf16KvToleranceAmplified : kBf16KvTolerance) << GetParam();
    } else {
      std::printf("%s bf16 KV cache: %zu of %zu routing decisions differ from the f32 cache's; logits reported\n",
                  GetParam().c_str(), flips, routed_f32.size());
      const bool sigmoid_flips = GetParam() == "deepseek_v3_plain" || GetParam() == "minimax_m2";
      if (sigmoid_flips) {
        EXPECT_LE(diff, kBf16KvTolerance) << GetParam();
      }
      EXPECT_TRUE(GetParam().rfind("gemma4", 0) == 0 || sigmoid_flips)
          << "routing flips under the bf16 cache outside Gemma 4's fixtures";
    }
  } else {
    EXPECT_LE(max_abs_diff(got, forced), kLogitTolerance) << GetParam();
    EXPECT_LE(diff, kLogitTolerance) << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(model_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
