// --kl-check: how far a lossy streamed run (--cut, --miss-kind) is from the exact one. A
// sample of decode steps also runs the exact step against the same state, and the
// divergence KL(exact || lossy) of the two next-token distributions is averaged over them.
#pragma once

#include <cstdint>
#include <span>

namespace sluice {

// KL(P || Q) in nats, P = softmax(p_logits), Q = softmax(q_logits), in double (rows of equal
// length; ids whose logit is -inf in both are skipped). 0 when the rows are equal.
double kl_divergence_nats(std::span<const float> p_logits, std::span<const float> q_logits);

// Which decode steps a check of n_check steps out of n_steps takes: step s (1-based) is checked
// when s = ceil(j * n_steps / n_check) for some j in 1..n_check, i.e. evenly spread over the
// generation, the last step included; every step when n_check >= n_steps. Deterministic, so
// two runs check the same steps.
bool kl_check_selects(int64_t step, int64_t n_steps, int64_t n_check);

}  // namespace sluice
