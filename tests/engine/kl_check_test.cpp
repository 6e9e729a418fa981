// --kl-check: the divergence of two logit rows, the steps a check samples, and the check inside
// a generation: exactly 0 when the run is exact (the two providers agree bit for bit), above 0
// when the deadline cuts (so the check does not compare a run to itself), and the text the
// same as the unchecked run's.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "backends/backend.h"
#include "engine/generator.h"
#include "engine/kl_check.h"
#include "experts/streaming_provider.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

TEST(KlCheck, DivergenceOfTwoRows) {
  const std::vector<float> p = {1.0f, 2.0f, 0.5f, -1.0f};
  EXPECT_EQ(kl_divergence_nats(p, p), 0.0);
  // A shift of every logit is the same distribution.
  std::vector<float> shifted = p;
  for (float& v : shifted) v += 3.0f;
  EXPECT_NEAR(kl_divergence_nats(p, shifted), 0.0, 1e-12);
  // Two tokens: P = softmax(0, 0) = (1/2, 1/2), Q = softmax(0, ln 3) = (1/4, 3/4):
  // KL = 1/2 ln 2 + 1/2 ln(2/3).
  const std::vector<float> a = {0.0f, 0.0f}, b = {0.0f, static_cast<float>(std::log(3.0))};
  EXPECT_NEAR(kl_divergence_nats(a, b), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_GT(kl_divergence_nats(b, a), 0.0);
  EXPECT_THROW(kl_divergence_nats(a, p), Error);
}

TEST(KlCheck, StepsAreSpreadAndCounted) {
  for (int64_t n_steps : {1, 7, 63, 100}) {
    for (int64_t n_check : {1, 3, 16, 63, 200}) {
      std::vector<int64_t> picked;
      for (int64_t s = 1; s <= n_steps; ++s)
        if (kl_check_selects(s, n_steps, n_check)) picked.push_back(s);
      ASSERT_EQ(static_cast<int64_t>(picked.size()), std::min(n_steps, n_check)) << n_steps << " " << n_check;
      EXPECT_EQ(picked.back(), n_steps);  // the last step is always among them
      // Evenly spread: gaps differ by at most one step.
      int64_t lo = n_steps, hi = 0, prev = 0;
      for (int64_t s : picked) {
        lo = std::min(lo, s - prev);
        hi = std::max(hi, s - prev);
        prev = s;
      }
      EXPECT_LE(hi - lo, 1) << n_steps << " " << n_check;
    }
  }
  EXPECT_FALSE(kl_check_selects(0, 10, 3));
  EXPECT_FALSE(kl_check_selects(11, 10, 3));
  EXPECT_FALSE(kl_check_selects(5, 10, 0));
}

namespace {

// A deterministic lossy provider: the exact streamer's routed sum times -2 (a cut at a disk's
// speed is not reproducible from run to run; this is, and it moves the KV rows far enough that
// an exact row left behind by the check changes the tokens: checked by swapping the order).
class ScaledProvider final : public ExpertProvider {
 public:
  explicit ScaledProvider(std::shared_ptr<ExpertProvider> inner) : inner_(std::move(inner)) {}
  void moe(Backend& be, const MoeLayerCall& call) override {
    inner_->moe(be, call);
    float* out = call.out.ptr<float>();  // CPU backend: host memory
    for (int64_t i = 0; i < call.out.numel(); ++i) out[i] *= -2.0f;
  }

 private:
  std::shared_ptr<ExpertProvider> inner_;
};

struct Checked {
  std::vector<int32_t> tokens;
  GenerateStats stats;
};

// Greedy generation of a fixture (qwen3_moe by default) streamed through top-k slots (the
// least); lossy: through ScaledProvider. kl_steps > 0: checked against a second, exact streamer.
Checked generate(bool lossy, int64_t kl_steps, float temperature = 0, const std::string& fixture = "qwen3_moe") {
  auto be = make_cpu_backend();
  const int64_t top_k = load_model(fixture_pack(fixture), *be).model->info().n_expert_used;
  StreamerOptions so;
  so.slots = static_cast<int32_t>(top_k);
  LoadOptions lo;
  lo.expert_kind = DType::q4;
  lo.streaming = so;
  LoadedModel m = load_model(fixture_pack(fixture), *be, lo);
  if (lossy) m.model->set_expert_provider(std::make_shared<ScaledProvider>(m.streamer));
  GenerateOptions g;
  g.n_predict = 12;
  g.sampling.temperature = temperature;
  g.sampling.seed = 7;
  g.kl_check_steps = kl_steps;
  if (kl_steps > 0) g.kl_exact = make_streamer(m.pack, DType::q4, m.model->info().n_expert_used, *be, so);
  Checked out;
  Generator gen(*m.model);
  out.stats = gen.generate(read_reference(fixture).prompt_ids, g, [&](int32_t id) {
    out.tokens.push_back(id);
    return true;
  });
  return out;
}

}  // namespace

TEST(KlCheck, ExactRunMeasuresZero) {
  // Both providers compute every expert exactly, so the logits agree bit for bit and the
  // computed divergence is exactly 0 (not 0 by construction: the check ran).
  const Checked c = generate(false, 100);
  EXPECT_TRUE(c.stats.kl.on);
  EXPECT_EQ(c.stats.kl.steps, 11);  // every decode step (12 tokens: the first from the prefill)
  EXPECT_EQ(c.stats.kl.decode_steps, 11);
  EXPECT_EQ(c.stats.kl.mean_nats, 0.0);
  EXPECT_EQ(c.stats.kl.max_nats, 0.0);
  EXPECT_EQ(c.tokens, generate(false, 0).tokens);
}

TEST(KlCheck, LossyRunMeasuresAboveZeroAndKeepsItsText) {
  const Checked plain = generate(true, 0);
  const Checked checked = generate(true, 4);
  EXPECT_EQ(checked.stats.kl.steps, 4);
  EXPECT_GT(checked.stats.kl.mean_nats, 0.0);
  EXPECT_GE(checked.stats.kl.max_nats, checked.stats.kl.mean_nats);
  EXPECT_GT(checked.stats.kl.seconds, 0.0);
  EXPECT_FALSE(plain.stats.kl.on);
  // The check leaves the lossy run's state as the lossy step wrote it: the same tokens as
  // without the check (a check that ran the exact step last would leave exact KV rows).
  EXPECT_EQ(checked.tokens, plain.tokens);
  EXPECT_NE(plain.tokens, generate(false, 0).tokens);  // and the lossy run is not the exact one
  // Sampled at temperature 1, every step checked: a draw is sensitive to any change of the
  // logits, so exact KV rows left behind would show in the tokens.
  EXPECT_EQ(generate(true, 100, 1.0f).tokens, generate(true, 0, 1.0f).tokens);
}

// The hybrid families (DeltaNet, QSA, PLE, hyper-connections): a decode step updates their
// recurrent state in place, so the check copies it before the exact step and puts it back
// (Model::save_for_rerun). Exact against exact is 0 at every step and leaves the tokens as they
// are without the check; a lossy run keeps its text (greedy, and sampled with every step
// checked), which a state left advanced by the exact step would change.
TEST(KlCheck, HybridFamiliesRerunTheirRecurrentState) {
  for (const std::string& fixture : hybrid_expert_fixtures()) {
    SCOPED_TRACE(fixture);
    const Checked exact = generate(false, 100, 0, fixture);
    EXPECT_EQ(exact.stats.kl.steps, 11);
    EXPECT_EQ(exact.stats.kl.mean_nats, 0.0);
    EXPECT_EQ(exact.tokens, generate(false, 0, 0, fixture).tokens);
    const Checked lossy = generate(true, 100, 0, fixture);
    EXPECT_GT(lossy.stats.kl.mean_nats, 0.0);
    EXPECT_EQ(lossy.tokens, generate(true, 0, 0, fixture).tokens);
    EXPECT_EQ(generate(true, 100, 1.0f, fixture).tokens, generate(true, 0, 1.0f, fixture).tokens);
  }
}
