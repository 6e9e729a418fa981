// sluice simulate: replays a routing trace through the residency code and prints the hit
// rate of each eviction policy next to the optimal (Belady) bound, one line per policy:
//   lru 0.601
//   belady 0.747
// A description of the run (trace size, cache shape) goes to stderr.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "cli_output.h"
#include "experts/simulate.h"

namespace sluice::cli {

void register_simulate(CLI::App& app) {
  struct Options {
    std::string trace, policy = "all", pin = "access", predictions = "after", prefetch = "off";
    int32_t slots_per_layer = 0, slots = 0, speculative = -1;
    double lrfu_half_life = PolicyOptions{}.lrfu_half_life_slots;
    double markov_half_life = PolicyOptions{}.markov_half_life_steps;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("simulate", "replay a routing trace through the expert cache");
  cmd->add_option("--trace", opt->trace, "routing trace (JSON lines, docs/trace-format.md)")->required();
  auto* spl = add_integer(*cmd, "--slots-per-layer", opt->slots_per_layer, IntRange::at_least(1),
                          "one cache of N slots per layer");
  auto* sl =
      add_integer(*cmd, "--slots", opt->slots, IntRange::at_least(1), "one shared pool of N slots over all layers");
  spl->excludes(sl);
  cmd->add_option("--policy", opt->policy, str("eviction policy: ", policy_names_text(), ", or all (default)"));
  cmd->add_option("--pin", opt->pin,
                  "how long an access pins its slot: access (each expert is its own request; the "
                  "convention of docs/trace-format.md) or step (a token's experts stay pinned together, as in the engine)");
  cmd->add_option("--predictions", opt->predictions,
                  "a shared pool with a trace's lookahead predictions: hand each row's prediction to the policy "
                  "after its step (default, as the engine's lookahead runs now), before it, or never");
  cmd->add_option("--prefetch", opt->prefetch,
                  "on: lookahead's prefetches too (a shared pool, a trace with predictions): each row's "
                  "prediction read into the speculative share after its step, landing before the next layer's; "
                  "prints the demand hit rate and the reads a demand access (misses and prefetches); off (default)");
  add_integer(*cmd, "--speculative", opt->speculative, IntRange::at_least(0),
              "with --prefetch on: the speculative share in slots (default: the engine's, a quarter of the pool)");
  add_real(*cmd, "--lrfu-half-life", opt->lrfu_half_life, RealRange::above(0),
           "lrfu: half-life of an access, in accesses per slot (default 8)");
  add_real(*cmd, "--markov-half-life", opt->markov_half_life, RealRange::above(0),
           "markov: half-life of the expert frequencies, in steps of the expert's layer (default: by the "
           "cache's shape, 4, 8 or 24; docs/policy.md)");
  cmd->callback([opt] {
    expect_input_file(opt->trace, "--trace", "a routing trace (JSON lines)");
    SLUICE_CHECK(opt->slots_per_layer > 0 || opt->slots > 0, Status::invalid_argument,
                 "simulate needs --slots-per-layer N or --slots N");
    SimulateOptions so;
    so.slots_per_layer = opt->slots_per_layer;
    so.slots = opt->slots;
    so.lrfu_half_life_slots = opt->lrfu_half_life;
    so.markov_half_life_steps = opt->markov_half_life;
    if (opt->pin == "access")
      so.pin = PinScope::access;
    else if (opt->pin == "step")
      so.pin = PinScope::step;
    else
      fail(Status::invalid_argument, "--pin: '", opt->pin, "' is not access or step");
    if (opt->predictions == "after")
      so.predictions = PredictionTime::after_step;
    else if (opt->predictions == "before")
      so.predictions = PredictionTime::before_step;
    else if (opt->predictions == "never")
      so.predictions = PredictionTime::never;
    else
      fail(Status::invalid_argument, "--predictions: '", opt->predictions, "' is not after, before or never");
    SLUICE_CHECK(opt->prefetch == "on" || opt->prefetch == "off", Status::invalid_argument, "--prefetch: '",
                 opt->prefetch, "' is not on or off");
    so.prefetch = opt->prefetch == "on";
    so.speculative_slots = opt->speculative;
    std::vector<PolicyKind> policies;
    if (opt->policy == "all") {
      policies.assign(online_policies().begin(), online_policies().end());
      policies.push_back(PolicyKind::belady);
    } else {
      std::optional<PolicyKind> p = policy_from_name(opt->policy);
      SLUICE_CHECK(p.has_value(), Status::invalid_argument, "--policy: '", opt->policy, "' is not one of ",
                   policy_names_text(), ", all");
      policies.push_back(*p);
    }
    Trace trace = read_trace(opt->trace);
    std::fprintf(stderr, "sluice: trace %s: %zu rows, %lld problems, %lld layers, %d experts, top-%d; %s, pin per %s\n",
                 opt->trace.c_str(), trace.rows.size(), static_cast<long long>(trace.n_problems),
                 static_cast<long long>(trace.n_layer), trace.n_expert, trace.top_k,
                 so.slots_per_layer > 0 ? str(so.slots_per_layer, " slots per layer").c_str()
                                        : str("one pool of ", so.slots, " slots").c_str(),
                 opt->pin.c_str());
    const int64_t asked = so.slots_per_layer > 0 ? so.slots_per_layer : so.slots;
    const int64_t cap = simulate_slot_cap(trace, so.slots_per_layer > 0);
    if (asked > cap)
      std::fprintf(stderr, "sluice: %lld slots replayed as %lld: every expert the trace routes to fits (no eviction)\n",
                   static_cast<long long>(asked), static_cast<long long>(cap));
    if (so.markov_half_life_steps == 0 &&
        std::find(policies.begin(), policies.end(), PolicyKind::markov) != policies.end()) {
      const double replayed = static_cast<double>(std::min(asked, cap));
      const double per_layer = so.slots_per_layer > 0 ? replayed : replayed / static_cast<double>(trace.n_layer);
      std::fprintf(stderr, "sluice: markov's frequency half-life: %g layer steps (by the cache's shape; "
                   "--markov-half-life sets it)\n",
                   markov_half_life_for(per_layer, trace.top_k, trace.n_expert));
    }
    if (so.prefetch) {
      const auto replayed = static_cast<int32_t>(std::min(asked, cap));
      std::fprintf(stderr, "sluice: prefetches into a speculative share of %d slots (belady: none, the reference); "
                   "columns: demand hit rate, reads a demand access, prefetches read, confirmed, wasted\n",
                   simulate_speculative_slots(so, replayed, trace.top_k));
    }
    for (PolicyKind p : policies) {
      so.policy = p;
      SimulateResult r = simulate_trace(trace, so);
      if (so.prefetch)
        std::printf("%s %.3f %.3f %llu %llu %llu\n", std::string(policy_name(p)).c_str(), r.hit_rate(),
                    r.reads_per_access(), static_cast<unsigned long long>(r.prefetch_reads),
                    static_cast<unsigned long long>(r.prefetch_confirmed),
                    static_cast<unsigned long long>(r.prefetch_wasted));
      else
        std::printf("%s %.3f\n", std::string(policy_name(p)).c_str(), r.hit_rate());
      stdout_flush();
    }
  });
}

}  // namespace sluice::cli
