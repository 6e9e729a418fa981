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

GenerateStats Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& opt,
                                  const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  SLUICE_CHECK(!prompt.empty(), Status::invalid_argument, "the prompt is empty");
  SLUICE_CHECK(opt.n_predict >= 0, Status::invalid_argument, "-n must be >= 0");
  const int64_t n_ctx = opt.n_ctx > 0 ? opt.n_ctx : static_cast<int64_t>(prompt.size()) + opt.n_predict;
  SLUICE_CHECK(static_cast<int64_t>(prompt.size()) + opt.n_predict <= n_ctx, Status::invalid_argument,
               "prompt (", prompt.size(), " tokens) + -n ", opt.n_predict, " exceeds the context size ", n_ctx);
  const int64_t V = model_.info().n_vocab;
  auto state = model_.new_state(n_ctx);
  Sampler sampler(opt.sampling);
  std::vector<float> logits(V);
  GenerateStats st;
  st.n_prompt = static_cast<int64_t>(prompt.size());

  auto t0 = clock::now();
  for (size_t i = 0; i < prompt.size(); i += opt.prefill_chunk) {
    size_t n = std::min<size_t>(opt.prefill_chunk, prompt.size() - i);
    model_.forward(prompt.subspan(i, n), *state, logits, false);
  }
  auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  for (int64_t step = 0; step < opt.n_predict; ++step) {
    int32_t next = sampler.sample(logits);
    if (opt.eos_id && next == *opt.eos_id) break;
    ++st.n_generated;
    if (!on_token(next)) break;
    if (step + 1 == opt.n_predict) break;
    model_.forward(std::span<const int32_t>(&next, 1), *state, logits, false);
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace sluice
