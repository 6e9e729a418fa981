// bench_plan: the host's share of a streamed decode step, per MoE layer: what the CUDA
// streamer's service thread does between the device's router_ready and its resident_ready
// signal besides writing the tables (docs/streamed-step.md: the phase-1 wait), on the CPU.
//
//   bench_plan [--layers 12] [--experts 128] [--top-k 8] [--expert-slots 153] [--tokens 2000]
//              [--policy markov] [--skew 1.2]
//
// Routing: each token's top-k distinct experts of a layer drawn from a Zipf(--skew)
// distribution over a per-layer permutation (so the cache hits at about the side by side's
// rate); every miss lands at once (the host tier). Prints a table of microseconds a layer
// for the union (step_union), the residency's acquire_step (the policy's on_step and
// eviction choice included) and the pins' release, and the hit rate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "experts/plan.h"
#include "experts/residency.h"

using namespace sluice;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int64_t layers = 12, n_expert = 128, k = 8, tokens = 2000;
  int32_t slots = 153;
  double skew = 1.2;
  std::string policy = "markov";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--layers") layers = std::atoll(v);
    else if (a == "--experts") n_expert = std::atoll(v);
    else if (a == "--top-k") k = std::atoll(v);
    else if (a == "--expert-slots") slots = std::atoi(v);
    else if (a == "--tokens") tokens = std::atoll(v);
    else if (a == "--policy") policy = v;
    else if (a == "--skew") skew = std::atof(v);
    else {
      std::fprintf(stderr, "bench_plan: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  ResidencyOptions ro;
  ro.n_slots = slots;
  ro.n_records = layers * n_expert;
  ro.n_expert = n_expert;
  const auto pk = policy_from_name(policy);
  if (!pk) {
    std::fprintf(stderr, "bench_plan: unknown policy %s\n", policy.c_str());
    return 2;
  }
  ro.policy = *pk;
  ro.policy_options.step_experts = k;
  Residency res(ro);

  std::mt19937_64 rng(1);
  std::vector<std::vector<int32_t>> perm(static_cast<size_t>(layers));
  for (auto& p : perm) {
    p.resize(static_cast<size_t>(n_expert));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
  }
  std::vector<double> cdf(static_cast<size_t>(n_expert));
  double sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) cdf[static_cast<size_t>(e)] = sum += std::pow(1.0 + e, -skew);
  std::uniform_real_distribution<double> u(0, sum);

  double t_union = 0, t_acquire = 0, t_release = 0;
  uint64_t steps = 0, hits = 0, routed = 0;
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k));
  std::vector<int32_t> pins;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t L = 0; L < layers; ++L) {
      for (int64_t j = 0; j < k; ++j) {
        int32_t e;
        do e = perm[static_cast<size_t>(L)][static_cast<size_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin())];
        while (std::find(ids.begin(), ids.begin() + j, e) != ids.begin() + j);
        ids[static_cast<size_t>(j)] = e;
        w[static_cast<size_t>(j)] = 1.0f / static_cast<float>(j + 1);
      }
      const auto t0 = Clock::now();
      const std::vector<StepExpert> un = step_union(ids, w, k, 0, 1, L, n_expert);
      const auto t1 = Clock::now();
      std::vector<int64_t> records(un.size());
      for (size_t i = 0; i < un.size(); ++i) records[i] = un[i].record;
      std::vector<AcquireResult> acq(un.size());
      res.acquire_step(records, DType::q4, acq);
      for (const AcquireResult& a : acq) {
        if (a.status == AcquireStatus::no_slot) {  // every slot pinned or loading: a cache too small
          std::fprintf(stderr, "bench_plan: no slot for a step of %lld experts in %d slots\n",
                       static_cast<long long>(records.size()), slots);
          return 1;
        }
        pins.push_back(a.slot);
        if (a.status == AcquireStatus::miss) res.complete_load(a.slot);  // the host tier: at once
        else ++hits;
      }
      const auto t2 = Clock::now();
      for (int32_t s : pins) res.release(s);
      pins.clear();
      const auto t3 = Clock::now();
      if (t >= tokens / 10) {  // after the warm-up
        t_union += std::chrono::duration<double>(t1 - t0).count();
        t_acquire += std::chrono::duration<double>(t2 - t1).count();
        t_release += std::chrono::duration<double>(t3 - t2).count();
        ++steps;
      }
      routed += static_cast<uint64_t>(k);
    }
  }
  const double us = 1e6 / static_cast<double>(steps);
  std::printf("| policy | slots | hit rate | step_union us | acquire_step us | release us | total us a layer |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %d | %.3f | %.2f | %.2f | %.2f | %.2f |\n", policy.c_str(), slots,
              static_cast<double>(hits) / static_cast<double>(routed), t_union * us, t_acquire * us, t_release * us,
              (t_union + t_acquire + t_release) * us);
  return 0;
}
