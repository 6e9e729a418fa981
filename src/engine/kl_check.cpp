// KL(exact || lossy) of two logit rows, and the steps --kl-check samples.
#include "engine/kl_check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace sluice {

namespace {
// log sum exp of a row, in double; -inf for a row of -inf.
double log_sum_exp(std::span<const float> x) {
  double m = -std::numeric_limits<double>::infinity();
  for (float v : x) m = std::max(m, static_cast<double>(v));
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}
}  // namespace

double kl_divergence_nats(std::span<const float> p_logits, std::span<const float> q_logits) {
  SLUICE_CHECK(p_logits.size() == q_logits.size() && !p_logits.empty(), Status::invalid_argument,
               "kl_divergence_nats: rows of ", p_logits.size(), " and ", q_logits.size(), " logits");
  const double lp = log_sum_exp(p_logits), lq = log_sum_exp(q_logits);
  double kl = 0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double log_p = p_logits[i] - lp;
    if (!std::isfinite(log_p)) continue;  // p = 0 contributes nothing
    kl += std::exp(log_p) * (log_p - (q_logits[i] - lq));
  }
  // Rounding can leave a tiny negative sum for near-equal rows; KL is never below 0.
  return std::max(0.0, kl);
}

bool kl_check_selects(int64_t step, int64_t n_steps, int64_t n_check) {
  if (n_check <= 0 || step < 1 || step > n_steps) return false;
  if (n_check >= n_steps) return true;
  // step = ceil(j * n_steps / n_check) holds for j = floor(step * n_check / n_steps) exactly
  // when that j is new at this step.
  return (step * n_check) / n_steps > ((step - 1) * n_check) / n_steps;
}

}  // namespace sluice
