// The sampler and the generated text at their limits (issue 15): temperatures below 1e-6 are
// greedy, scaling that would overflow never yields NaN, -inf logits (masked ids) are never
// drawn; an id beyond the tokenizer decodes to nothing with a single warning.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/models/fixture_util.h"
#include "core/log.h"
#include "engine/generated_text.h"
#include "engine/sampler.h"

using namespace sluice;
using namespace sluice::test;

// Logits of a trained model's size: 20 / 1e-38 overflows float, which made every draw NaN.
TEST(SamplerLimits, TinyTemperaturesAreGreedy) {
  const std::vector<float> logits = {5.0f, 20.0f, 19.999f, -3.0f};
  for (float t : {1e-38f, 1e-20f, 9.9e-7f}) {
    Sampler s({t, 1.0f, 0, 7});
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 1) << t;
  }
}

// Logits near float's limit: logit / T alone would overflow to inf, and inf - inf is NaN.
TEST(SamplerLimits, ScalingThatWouldOverflowStaysFinite) {
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> logits = {big / 3, big, -big, big / 2};
  for (float t : {0.5f, 1e-5f}) {
    Sampler s({t, 1.0f, 0, 3});
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 1) << t;
    Sampler top({t, 0.9f, 2, 3});
    EXPECT_EQ(top.sample(logits), 1) << t;
  }
  EXPECT_EQ(first_non_finite(logits), -1);
  EXPECT_EQ(first_non_finite(std::vector<float>{0, 1, std::nanf(""), 2}), 2);
  EXPECT_EQ(first_non_finite(std::vector<float>{0, std::numeric_limits<float>::infinity()}), 1);
}

TEST(SamplerLimits, MaskedIdsAreNeverDrawn) {
  std::vector<float> logits(64, 0.0f);
  for (size_t i = 32; i < logits.size(); ++i) logits[i] = -std::numeric_limits<float>::infinity();
  Sampler s({1000.0f, 1.0f, 0, 11});
  for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(logits), 32);
}

TEST(GeneratedText, IdsBeyondTheTokenizerPrintNothingWithOneWarning) {
  const Tokenizer tok = Tokenizer::load(fixture_dir("qwen3_moe"));  // 503 tokens; the model has 512 rows
  ASSERT_EQ(tok.vocab_size(), 503);
  std::vector<std::string> warnings;
  log_set_sink([&](LogLevel level, const std::string& m) {
    if (level == LogLevel::warn) warnings.push_back(m);
  });
  GeneratedText text(tok);
  const std::vector<int32_t> ids = tok.encode("hello world");
  std::string out;
  for (int32_t id : ids) {
    out += text.push(id);
    out += text.push(510);
  }
  out += text.push(511) + text.flush();
  log_set_sink({});
  EXPECT_EQ(out, tok.decode(ids));
  EXPECT_EQ(text.unknown_ids(), static_cast<int64_t>(ids.size()) + 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("token id 510 is outside the tokenizer's 503 tokens"), std::string::npos) << warnings[0];
}
