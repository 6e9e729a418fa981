// Generator: chunked prefill, then one token per decode step.
#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "core/sampling.h"
#include "engine/kl_check.h"

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
  if (opt.kl_check_steps > 0) {
    SLUICE_CHECK(opt.kl_exact != nullptr, Status::invalid_argument, "--kl-check needs an exact expert provider");
    SLUICE_CHECK(model_.decode_step_rerunnable(), Status::invalid_argument, "--kl-check: the ",
                 model_.info().family,
                 " family's decode step cannot run twice at one position, so the exact step cannot run beside the "
                 "lossy one");
    st.kl.on = true;
  }
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
  std::optional<int64_t> pending_draw;  // the draw of the step forward_sample may have enqueued ahead
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
    if (st.kl.on) ++st.kl.decode_steps;
    if (kl_check_selects(step + 1, opt.n_predict - 1, opt.kl_check_steps)) {
      next = checked_step(next, *state, sampler, n_sampled, opt, st, step);
    } else {
      // This step's draw (taken by the step before, which may have enqueued this step ahead
      // with it), and the next one's when a forward_sample step follows: the sampler's
      // sequence in the same order either way.
      const int64_t draw = pending_draw ? *pending_draw : sampler.next_draw53();
      pending_draw.reset();
      if (opt.steps_ahead && step + 2 < opt.n_predict &&
          !kl_check_selects(step + 2, opt.n_predict - 1, opt.kl_check_steps))
        pending_draw = sampler.next_draw53();
      next = model_.forward_sample(next, *state, sampler.rule(), n_sampled, draw, pending_draw);
    }
    SLUICE_CHECK(next >= 0, Status::corrupt, "the model's logits are not finite at generation step ", step + 2,
                 " (the token after position ", n_prompt + step, "): NaN or infinite weights or activations");
  }
  st.decode_seconds = std::max(0.0, std::chrono::duration<double>(clock::now() - t1).count() - st.kl.seconds);
  if (st.kl.steps > 0) st.kl.mean_nats /= static_cast<double>(st.kl.steps);  // the sum until here
  return st;
}

// The exact step runs first, through the exact provider, at position p; then n_past goes back
// to p and the lossy step runs through the run's own provider, overwriting every KV row the
// exact step wrote at p (decode_step_rerunnable; what a step changes in place, the hybrids'
// recurrent state, is put back first: Model::save_for_rerun). So the state after is the lossy run's, the
// generated text is what the run without --kl-check would generate, and the exact step saw
// exactly the lossy run's history (with a replayed routing, the same rows of it). Why not the
// other order or one streamer: running the exact
// step second would leave exact KV rows at p for the rest of the run, and running it through
// the run's own streamer would load the step's misses into that cache, so the lossy step after
// it would find them resident and cut nothing (KL 0: the check would compare a run to itself).
// The second streamer's own cache keeps the lossy one untouched; its reads are done when its
// step returns. The exact pass's time is left out of decode_seconds (kl.seconds). One bias,
// small: reads the lossy cache left in flight at the previous step land during the exact pass.
int32_t Generator::checked_step(int32_t token, SequenceState& state, Sampler& sampler, int64_t n_sampled,
                                const GenerateOptions& opt, GenerateStats& st, int64_t step) {
  using clock = std::chrono::steady_clock;
  const size_t V = static_cast<size_t>(model_.info().n_vocab);
  kl_exact_logits_.resize(V);
  kl_lossy_logits_.resize(V);
  SequenceState* states[] = {&state};
  const int64_t pos = state.n_past;
  const std::shared_ptr<ExpertProvider> lossy = model_.expert_provider();
  const auto t0 = clock::now();
  const std::unique_ptr<StepUndo> undo = model_.save_for_rerun(state);  // recurrent state (hybrids)
  // A replayed routing gives the lossy step the rows the exact step took.
  RoutingReplay* replay = model_.routing_replay();
  const std::vector<int64_t> replay_at = replay ? replay->position() : std::vector<int64_t>{};
  model_.set_expert_provider(opt.kl_exact);
  try {
    model_.forward_batch(std::span<const int32_t>(&token, 1), states, kl_exact_logits_);
  } catch (...) {
    model_.set_expert_provider(lossy);
    throw;
  }
  model_.set_expert_provider(lossy);
  if (undo) undo->restore();
  if (replay) replay->set_position(replay_at);
  state.n_past = pos;
  st.kl.seconds += std::chrono::duration<double>(clock::now() - t0).count();
  model_.forward_batch(std::span<const int32_t>(&token, 1), states, kl_lossy_logits_);
  const auto exact = std::span<const float>(kl_exact_logits_).first(static_cast<size_t>(n_sampled));
  const auto lossy_row = std::span<const float>(kl_lossy_logits_).first(static_cast<size_t>(n_sampled));
  check_logits_finite(lossy_row, step + 2, pos);
  check_logits_finite(exact, step + 2, pos);
  const double kl = kl_divergence_nats(exact, lossy_row);
  st.kl.steps += 1;
  st.kl.mean_nats += kl;
  st.kl.max_nats = std::max(st.kl.max_nats, kl);
  // The draw forward_sample's host path makes (Model::forward_sample): same rule, same number.
  SampleScratch scratch;
  return sample_row(lossy_row, sampler.rule(), static_cast<double>(sampler.next_draw53()) * 0x1p-53, scratch);
}

}  // namespace sluice
