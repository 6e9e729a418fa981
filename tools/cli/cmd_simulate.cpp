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
#include "experts/routing_replay.h"
#include "experts/simulate.h"

namespace sluice::cli {

void register_simulate(CLI::App& app) {
  struct Options {
    std::string trace, policy = "all", pin = "access", predictions = "after", lookahead = "off";
    std::string map, replay_map = "auto", write_trace;
    int64_t tokens = 0;
    int32_t slots_per_layer = 0, slots = 0, speculative = -1;
    double lrfu_half_life = PolicyOptions{}.lrfu_half_life_slots;
    double markov_half_life = PolicyOptions{}.markov_half_life_steps;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("simulate", "replay a routing trace through the expert cache");
  cmd->add_option("--trace", opt->trace, "routing trace (JSON lines, docs/trace-format.md)")->required();
  auto* spl = add_integer(*cmd, "--expert-slots-per-layer", opt->slots_per_layer, IntRange::at_least(1),
                          "one cache of N slots per layer");
  auto* sl =
      add_integer(*cmd, "--expert-slots", opt->slots, IntRange::at_least(1), "one shared pool of N slots over all layers");
  spl->excludes(sl);
  cmd->add_option("--policy", opt->policy, str("eviction policy: ", policy_names_text(), ", or all (default)"));
  cmd->add_option("--pin", opt->pin,
                  "how long an access pins its slot: access (each expert is its own request; the "
                  "convention of docs/trace-format.md) or step (a token's experts stay pinned together, as in the engine)");
  cmd->add_option("--predictions", opt->predictions,
                  "a shared pool with a trace's lookahead predictions: hand each row's prediction to the policy "
                  "after its step (default, as the engine's lookahead runs now), before it, or never");
  cmd->add_option("--lookahead", opt->lookahead,
                  "on: lookahead's prefetches too (a shared pool, a trace with predictions): each row's "
                  "prediction read into the speculative share after its step, landing before the next layer's; "
                  "prints the demand hit rate and the reads a demand access (misses and prefetches); off (default)");
  add_integer(*cmd, "--speculative", opt->speculative, IntRange::at_least(0),
              "with --lookahead on: the speculative share in slots (default: the engine's, a quarter of the pool)");
  cmd->add_option("--map", opt->map,
                  "LAYERS,EXPERTS,TOPK: replay the routing --replay-routing gives a pack of LAYERS MoE layers of "
                  "EXPERTS experts, top-TOPK (one stream from a cold cache; docs/streaming.md)");
  cmd->add_option("--replay-map", opt->replay_map, "with --map: auto (default), ids or fit, as --replay-routing's");
  add_integer(*cmd, "--tokens", opt->tokens, IntRange::at_least(1),
              "with --map: replay this many tokens of the stream (default: the stream's, once)");
  cmd->add_option("--write-trace", opt->write_trace, "write the trace replayed (after --map) as JSON lines");
  add_real(*cmd, "--lrfu-half-life", opt->lrfu_half_life, RealRange::above(0),
           "lrfu: half-life of an access, in accesses per slot (default 8)");
  add_real(*cmd, "--markov-half-life", opt->markov_half_life, RealRange::above(0),
           "markov: half-life of the expert frequencies, in steps of the expert's layer (default: by the "
           "cache's shape, 4, 8 or 24; docs/policy.md)");
  cmd->callback([opt] {
    expect_input_file(opt->trace, "--trace", "a routing trace (JSON lines)");
    SLUICE_CHECK(opt->slots_per_layer > 0 || opt->slots > 0, Status::invalid_argument,
                 "simulate needs --expert-slots-per-layer N or --expert-slots N");
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
    SLUICE_CHECK(opt->lookahead == "on" || opt->lookahead == "off", Status::invalid_argument, "--lookahead: '",
                 opt->lookahead, "' is not on or off");
    so.prefetch = opt->lookahead == "on";
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
    if (!opt->write_trace.empty()) expect_output_file(opt->write_trace, "--write-trace", "a file for the trace");
    Trace trace = read_trace(opt->trace);
    if (!opt->map.empty()) {
      const std::vector<int32_t> shape = parse_token_list(opt->map);
      SLUICE_CHECK(shape.size() == 3 && shape[0] > 0 && shape[1] > 0 && shape[2] > 0 && shape[2] <= shape[1],
                   Status::invalid_argument, "--map ", opt->map, ": expected LAYERS,EXPERTS,TOPK (e.g. 48,128,8)");
      const std::optional<ReplayMapping> mapping = replay_mapping_from_name(opt->replay_map);
      SLUICE_CHECK(mapping, Status::invalid_argument, "--replay-map: '", opt->replay_map, "' (auto, ids or fit)");
      const ReplayTable table = map_routing_trace(trace, std::filesystem::path(opt->trace).filename().string(),
                                                  {shape[0], shape[1], shape[2]}, *mapping);
      std::fprintf(stderr, "sluice: mapped (%s): %s\n", table.mapping.c_str(), table.rule.c_str());
      if (!table.fit.empty()) std::fprintf(stderr, "sluice: routing fit: %s\n", table.fit.c_str());
      trace = replay_as_trace(table, opt->tokens > 0 ? opt->tokens : table.n_tokens);
    } else {
      SLUICE_CHECK(opt->tokens == 0 && opt->replay_map == "auto", Status::invalid_argument,
                   opt->tokens ? "--tokens" : "--replay-map", " needs --map LAYERS,EXPERTS,TOPK");
    }
    if (!opt->write_trace.empty()) write_trace(trace, opt->write_trace);
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
