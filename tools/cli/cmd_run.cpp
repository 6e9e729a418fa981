// sluice run: generate text from a prompt, streaming it to stdout; a summary line on stderr.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "cli_context.h"
#include "cli_output.h"
#include "engine/generated_text.h"
#include "engine/generator.h"
#include "engine/routing_trace.h"

namespace sluice::cli {

void register_run(CLI::App& app) {
  struct Options {
    ModelOptions model;
    PromptOptions prompt;
    std::string trace;
    int64_t n_predict = 32;
    float temperature = 0.8f, top_p = 1.0f;
    int32_t top_k = 0;
    uint64_t seed = 0;
    int64_t n_ctx = 0;
    bool print_ids = false, ignore_eos = false;
    int64_t kl_check = 0;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "generate text from a prompt");
  add_model_options(*cmd, opt->model);
  add_prompt_options(*cmd, opt->prompt);
  add_integer(*cmd, "-n,--n-predict", opt->n_predict, IntRange::at_least(0), "tokens to generate (default 32)");
  // Stored as floats: beyond about 1e30 a temperature's draw is uniform anyway, and a top-p below
  // the top token's probability keeps that token alone, so saturating (cli_args.h) changes nothing.
  add_real(*cmd, "--temperature", opt->temperature, RealRange::at_least(0, "0 is greedy"),
           "sampling temperature; 0 is greedy (default 0.8)");
  add_real(*cmd, "--top-p", opt->top_p, RealRange::above(0, 1), "nucleus sampling mass in (0, 1] (default 1)");
  add_integer(*cmd, "--top-k", opt->top_k, IntRange::at_least(0, "0 keeps every token"),
              "keep the k most likely tokens; 0 keeps all (default 0)");
  add_seed(*cmd, "--seed", opt->seed, "random seed, 0 to 2^64-1 (default 0)");
  add_integer(*cmd, "--ctx", opt->n_ctx, IntRange::at_least(0, "0: prompt + n"),
              "context size in tokens (default: prompt + n)");
  cmd->add_flag("--print-ids", opt->print_ids, "end stdout with the generated token ids, comma-separated");
  cmd->add_option("--trace-routing", opt->trace,
                  "write every routing decision as JSON lines (the routing-trace format, docs/trace-format.md; with --lookahead on also "
                  "the next layer's predicted experts)");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "keep generating past the end-of-sequence token");
  add_integer(*cmd, "--kl-check", opt->kl_check, IntRange::at_least(1),
              "with a lossy streaming option (--cut, --miss-kind): N decode steps, spread over the run, also run "
              "the exact step; prints the mean and max KL(exact || lossy) in nats/token");
  cmd->callback([opt] {
    require_prompt(opt->prompt, "run");
    check_kl_check_options(opt->model, opt->kl_check);
    if (!opt->trace.empty()) expect_output_file(opt->trace, "--trace-routing", "a file for the routing trace");
    Session s = open_session(opt->model);
    std::vector<int32_t> prompt = prompt_tokens(s.model, opt->prompt);
    check_generation_context(s, static_cast<int64_t>(prompt.size()), opt->n_predict, opt->n_ctx);
    const KlCheckStats kl_plan = plan_kl_check(opt->model, s, opt->kl_check);
    GenerateOptions g;
    if (kl_plan.on && !kl_plan.by_construction) {
      g.kl_check_steps = opt->kl_check;
      g.kl_exact = make_exact_streamer(s);
    }
    g.n_predict = opt->n_predict;
    g.sampling = {opt->temperature, opt->top_p, opt->top_k, opt->seed};
    if (!opt->ignore_eos) g.eos_id = s.model.eos_id();
    g.n_ctx = opt->n_ctx;
    g.prefill_chunk = opt->model.ubatch;
    if (s.model.tokenizer) g.n_vocab_sampled = s.model.tokenizer->vocab_size();  // padded rows never sampled
    std::vector<int32_t> generated;
    std::optional<GeneratedText> text;  // without a tokenizer, ids only (--print-ids)
    if (s.model.tokenizer) text.emplace(*s.model.tokenizer);
    std::unique_ptr<RoutingTraceWriter> trace;
    if (!opt->trace.empty()) {
      trace = std::make_unique<RoutingTraceWriter>(opt->trace);
      // With lookahead on, each record also carries the next layer's predicted experts.
      s.model.model->set_routing_observer(trace->observer(), opt->model.lookahead == "on");
    }
    InterruptFlag interrupt;  // Ctrl-C: stop at the next token boundary, then report as usual
    g.cancel = interrupt.flag();
    PrefillProgress prefill;
    g.on_prefill = [&](int64_t done, int64_t total) { prefill.update(done, total); };
    Generator gen(*s.model.model);
    GenerateStats st = gen.generate(prompt, g, [&](int32_t id) {
      if (generated.empty()) prefill.finish();
      generated.push_back(id);
      // Without a tokenizer (a pack made without one) the text is the ids, comma-separated.
      stdout_write(text ? text->push(id) : str(generated.size() > 1 ? "," : "", id));
      return true;
    });
    prefill.finish();
    stdout_write((text ? text->flush() : std::string()) + "\n");
    if (opt->print_ids) {
      std::string ids;
      for (size_t i = 0; i < generated.size(); ++i) {
        if (i) ids += ',';
        ids += std::to_string(generated[i]);
      }
      stdout_write(ids + "\n");
    }
    s.model.model->set_routing_observer(nullptr);
    if (trace) trace->close();
    const std::string experts = s.model.expert_kind ? str(", ", expert_kind_name(*s.model.expert_kind), " experts") : "";
    const RoutingReplay* replay = s.model.model->routing_replay();
    const std::string routing =
        replay ? str(" | replayed routing: ", replay->table().source, ", ", replay->table().mapping) : std::string();
    std::fprintf(stderr, "sluice: %s (%s%s, %.1fM params) | prompt %lld tokens, %.1f tok/s | generated %lld tokens, %.1f tok/s%s\n",
                 s.model.dir.filename().string().c_str(), s.model.model->info().family.c_str(), experts.c_str(),
                 s.model.model->info().n_params / 1e6, static_cast<long long>(st.n_prompt),
                 st.prefill_tokens_per_second(), static_cast<long long>(st.n_generated),
                 st.decode_tokens_per_second(), routing.c_str());
    if (replay)
      std::fprintf(stderr, "sluice: the text above was generated with a replayed routing, not the model's own: it is not "
                           "the model's output\n");
    RunTokens tokens;
    tokens.prefill_tokens = st.n_prompt;
    tokens.prefill_seconds = st.prefill_seconds;
    tokens.decode_tokens = std::max<int64_t>(0, st.n_generated - 1);  // the first comes from the prefill
    tokens.decode_seconds = st.decode_seconds;
    // The generator counts the decode steps it ran, also one whose token was the eos (not
    // generated: "1 of 0 decode steps" before); an exact run's plan has no count of its own.
    KlCheckStats kl = kl_plan.by_construction ? kl_plan : st.kl;
    if (kl_plan.by_construction) kl.decode_steps = tokens.decode_tokens;
    tokens.kl_check = kl;
    if (std::optional<RunStats> rs = finish_streaming(opt->model, s, tokens)) {
      std::fprintf(stderr, "sluice: streaming: %s\n", rs->summary().c_str());
      if (opt->model.fake_experts)
        std::fprintf(stderr, "sluice: --fake-experts: the experts were not read; the text above is meaningless\n");
    }
    if (kl.on) std::fprintf(stderr, "sluice: kl-check: %s\n", kl_check_summary(kl).c_str());
    if (st.interrupted) exit_interrupted("generation stopped at a token boundary");
  });
}

}  // namespace sluice::cli
