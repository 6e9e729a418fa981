// bench_sample: the host's draw (core/sampling.h's rule, what every sampled token costs on the
// CPU backend and the first token of every generation costs on CUDA, drawn from the prefill's
// logits) over one row of a Qwen3-sized vocabulary, for greedy, a temperature, top-p and
// top-k. Prints a markdown table: ms a draw (mean over the draws) and the sum of the ids
// drawn (the same sum before and after a change that keeps the rule's values).
//
// Usage: bench_sample [draws a rule, default 50] [vocabulary, default 151669].
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/sampling.h"

using namespace sluice;

int main(int argc, char** argv) {
  const int draws = argc > 1 ? std::atoi(argv[1]) : 50;
  const int64_t vocab = argc > 2 ? std::atoll(argv[2]) : 151669;
  if (draws <= 0 || vocab <= 0) {
    std::fprintf(stderr, "usage: bench_sample [draws > 0] [vocabulary > 0]\n");
    return 1;
  }
  // A nearly flat row (a random-weight model's: the widest nucleus, the slowest top-p).
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (float& x : logits) x = nd(rng);
  std::printf("| rule | ms a draw | ids drawn, summed |\n|---|---|---|\n");
  struct Case {
    const char* name;
    SampleRule rule;
  };
  SampleScratch scratch;
  for (const Case& c : {Case{"greedy", {0.0f, 0, 1.0f}}, Case{"temperature 1", {1.0f, 0, 1.0f}},
                        Case{"temperature 0.8, top-p 0.95", {0.8f, 0, 0.95f}},
                        Case{"temperature 0.7, top-k 40", {0.7f, 40, 1.0f}},
                        Case{"top-k 40, top-p 0.95", {0.8f, 40, 0.95f}}}) {
    long long sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < draws; ++r) sum += sample_row(logits, c.rule, (r + 0.5) / draws, scratch);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / draws;
    std::printf("| %s | %.3f | %lld |\n", c.name, ms, sum);
  }
  return 0;
}
