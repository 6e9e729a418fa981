// Generator: chunked prefill, then one token per decode step.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace sluice {

double GenerateStats::decode_tokens_per_second() const {
  // The first generated token comes from the prefill's logits; the others from decode steps.
  return decode_seconds > 0 && n_generated > 1 ? (n_generated - 1) / decode_seconds : 0;
}

namespace {

// The logits a token is sampled from must be finite: a NaN (NaN weights or embeddings) or an
// overflow would otherwise make every draw meaningless ("generated 0 tokens", or the same id
// again and again) with no hint why.
void check_logits_finite(std::span<const float> logits, int64_t step, int64_t position) {
  const int64_t bad = first_non_finite(logits);
  SLUICE_CHECK(bad < 0, Status::corrupt, "the model's logits are not finite at generation step ", step + 1,
               " (the token after position ", position, "): token ", bad, " has logit ", logits[bad],
               " (NaN or infinite weights or activations)");
}

}  // namespace

GenerateStats Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& opt,
                                  const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  SLUICE_CHECK(!prompt.empty(), Status::invalid_argument, "the prompt is empty");
  SLUICE_CHECK(opt.n_predict >= 0, Status::invalid_argument, "-n must be >= 0");
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t n_ctx = opt.n_ctx > 0 ? opt.n_ctx : n_prompt + opt.n_predict;
  SLUICE_CHECK(n_prompt + opt.n_predict <= n_ctx, Status::invalid_argument,
               "prompt (", prompt.size(), " tokens) + -n ", opt.n_predict, " exceeds the context size ", n_ctx);
  model_.check_context(n_ctx, opt.n_ctx > 0 ? str("--ctx ", n_ctx)
                                            : str("prompt (", n_prompt, " tokens) + -n ", opt.n_predict));
  const int64_t V = model_.info().n_vocab;
  const int64_t n_sampled = opt.n_vocab_sampled > 0 ? std::min(opt.n_vocab_sampled, V) : V;
  auto state = model_.new_state(n_ctx);
  Sampler sampler(opt.sampling);
  std::vector<float> logits(V);
  GenerateStats st;
  st.n_prompt = n_prompt;
  auto cancelled = [&] { return opt.cancel && opt.cancel->load(); };

  auto t0 = clock::now();
  for (int64_t i = 0; i < n_prompt && !st.interrupted; i += opt.prefill_chunk) {
    if (cancelled()) {
      st.interrupted = true;
      break;
    }
    const int64_t n = std::min(opt.prefill_chunk, n_prompt - i);
    model_.forward(prompt.subspan(static_cast<size_t>(i), static_cast<size_t>(n)), *state, logits, false);
    if (opt.on_prefill) opt.on_prefill(i + n, n_prompt);
  }
  auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // The first token is drawn here from the prefill's logits; every later one by a decode step
  // that draws it itself (Model::forward_sample: on a GPU only the token id crosses to the
  // host), with the same rule and the sampler's next uniform number.
  int32_t next = -1;
  for (int64_t step = 0; step < opt.n_predict && !st.interrupted; ++step) {
    if (cancelled()) {
      st.interrupted = true;
      break;
    }
    if (step == 0) {
      check_logits_finite(std::span<const float>(logits).first(static_cast<size_t>(n_sampled)), step, n_prompt - 1);
      next = sampler.sample(std::span<const float>(logits).first(static_cast<size_t>(n_sampled)));
    }
    if (opt.eos_id && next == *opt.eos_id) break;
    ++st.n_generated;
    if (!on_token(next)) break;
    if (step + 1 == opt.n_predict) break;
    next = model_.forward_sample(next, *state, sampler.rule(), n_sampled, sampler.next_draw53());
    SLUICE_CHECK(next >= 0, Status::corrupt, "the model's logits are not finite at generation step ", step + 2,
                 " (the token after position ", n_prompt + step, "): NaN or infinite weights or activations");
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace sluice
